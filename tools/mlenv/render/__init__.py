"""Deployment -> what a backend sends: Kubernetes objects, an sbatch script or a Run:ai argv."""
