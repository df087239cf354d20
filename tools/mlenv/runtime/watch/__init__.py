"""What watches a running job: the observer protocol, hang, idle, node-fault signs, transport proof."""
