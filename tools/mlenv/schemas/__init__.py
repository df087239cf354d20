"""Schemas shipped as package data (OpenShift and Multus CRDs)."""
