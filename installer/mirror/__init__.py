"""gpu-install mirror: what an air-gapped site needs, computed from the resolved Plan (installer.plan), never from a
second list. installer.mirror.plan: the artifact plan (images, the chart, files, OS package roots), no network.
"""
