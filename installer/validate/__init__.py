"""Post-install validation: facts read from the nodes and the cluster, checked against the site.

installer.validate.nvsmi parses `nvidia-smi -q -x` (and the driver-not-loaded output) into typed facts;
installer.validate.node turns those facts and the site's expectations into findings.
"""
