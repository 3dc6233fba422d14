"""p3o.lazy: a package's names imported on first read (PEP 562)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from p3o.lazy import lazy_exports


def test_lazy_exports_reads_the_named_module_and_refuses_other_names():
    getattr_ = lazy_exports("pkg", {"json": ("dumps",), "os.path": ("join", "sep")})
    import json
    import os.path

    assert getattr_("dumps") is json.dumps
    assert getattr_("join") is os.path.join
    with pytest.raises(AttributeError, match="module 'pkg' has no attribute 'loads'"):
        getattr_("loads")


def test_packages_import_their_heavy_names_only_when_read():
    code = (
        "import sys, p3o.eval, p3o.metrics; assert 'torch' not in sys.modules; "
        "p3o.eval.pass_at_k; assert 'p3o.eval.passk' in sys.modules; print(p3o.metrics.METRICS_FILE)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip()
