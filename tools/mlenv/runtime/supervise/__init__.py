"""Running a node's share: the launcher, the node supervisor, reaping, control, detached jobs, standbys."""
