"""What runs record on the nodes and the restart policy over those records."""
