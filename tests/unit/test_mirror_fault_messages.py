"""The messages of the mirror's faults, from skopeo's own words (verbatim lines as skopeo 1.9 writes them): a
certificate out of its dates, and a full disk. The faults themselves: tests/integration/test_mirror_faults.py."""

from __future__ import annotations

import shutil

from installer.errors import EXIT_ENVIRONMENT
from installer.mirror import common
from installer.mirror.images import _repository

EXPIRED = ('time="2026-11-26T19:16:02Z" level=fatal msg="initializing source docker://127.0.0.1:36969/nv/nvidia/'
           'gpu-operator:v24.9.2: pinging container registry 127.0.0.1:36969: Get \\"https://127.0.0.1:36969/v2/\\": '
           'x509: certificate has expired or is not yet valid: current time 2026-11-26T19:16:02Z is after '
           '2026-10-22T19:16:02Z"')
FUTURE = ('time="2026-11-26T19:16:02Z" level=fatal msg="trying to reuse blob sha256:ab at destination: pinging '
          'container registry registry.example.com: Get \\"https://registry.example.com/v2/\\": x509: certificate '
          'has expired or is not yet valid: current time 2026-11-26T19:16:02Z is before 2026-11-28T19:16:02Z"')


def test_an_expired_certificate_names_the_host_the_dates_and_the_fix():
    msg = common.skopeo_message(EXPIRED, [])
    assert msg.startswith("the certificate of 127.0.0.1:36969 expired on 2026-10-22T19:16:02Z (this machine's time "
                          "is 2026-11-26T19:16:02Z): renew the registry's certificate"), msg
    assert msg.endswith('is after 2026-10-22T19:16:02Z)')  # skopeo's own words kept


def test_a_certificate_not_valid_yet_points_at_the_clock():
    msg = common.skopeo_message(FUTURE, [])
    assert msg.startswith("the certificate of registry.example.com is valid only from 2026-11-28T19:16:02Z and this "
                          "machine's time is 2026-11-26T19:16:02Z: this machine's clock is behind"), msg


def test_other_messages_are_left_as_skopeo_wrote_them():
    line = 'time="x" level=fatal msg="reading manifest v1 in r/x: manifest unknown"'
    assert common.skopeo_message(line, []) == "reading manifest v1 in r/x: manifest unknown"
    assert common.cert_dates_problem("x509: certificate signed by unknown authority") is None


def test_disk_full_names_the_path_what_is_free_and_what_is_needed(tmp_path):
    exc = common.disk_full(tmp_path / "bundle" / "not-yet", 3 << 20)
    assert exc.exit_code == EXIT_ENVIRONMENT
    free = shutil.disk_usage(tmp_path).free  # the nearest existing directory's file system
    assert exc.message == f"{tmp_path / 'bundle' / 'not-yet'}: no space left on device ({free} bytes free there; " \
                          "the images not pulled yet need 3145728 bytes more (3.0 MiB))"
    assert "run pull again" in (exc.hint or "")


def test_repository_of_a_reference():
    assert _repository("127.0.0.1:5000/nv/nvidia/gpu-operator:v24.9.2") == "127.0.0.1:5000/nv/nvidia/gpu-operator"
    assert _repository("reg:5000/a/b@sha256:" + "0" * 64) == "reg:5000/a/b"
    assert _repository("nvcr.io/nvidia/cuda") == "nvcr.io/nvidia/cuda"
