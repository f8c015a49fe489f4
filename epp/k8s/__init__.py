"""Cluster mode: watches of the pool, its pods and the objectives, objective
status, and Lease leader election (see README.md here). Entry point:
`epp.k8s.cluster.cluster_mode`."""
