"""The Slurm backend: an allocation held by a batch job (deploy), steps inside it (exec, shell, launch), or a
run as a batch job of its own (launch without deploy); apptainer containers; Slurm reached here or over ssh."""
