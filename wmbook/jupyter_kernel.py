"""The Jupyter kernel a run uses: the named one, checked to exist, or ``python3`` of this interpreter."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Iterator

from jupyter_client.kernelspec import KernelSpecManager

from .errors import InputError

__all__ = ["check_kernel", "kernel_for_this_python"]


def _python_dir(executable: str) -> Path:
    return Path(os.path.abspath(executable)).parent


@contextlib.contextmanager
def kernel_for_this_python(kernel_name: str | None) -> Iterator[str]:
    """Yield a kernel name whose kernel runs in *this* interpreter's environment.

    An explicitly named kernel is used as is. For the default ``python3``: jupyter_client
    maps a spec whose argv[0] is ``python``/``python3`` to ``sys.executable``, which is what
    we want; but a user-level kernelspec (``~/.local/share/jupyter/kernels/python3``)
    pointing at another interpreter would shadow it and run the notebooks without wmbook.
    In that case a private ``python3`` spec for ``sys.executable`` is put first on
    ``JUPYTER_PATH`` for the duration of the run (nothing is installed).
    """
    if kernel_name is not None:
        yield kernel_name
        return
    name = "python3"
    ok = False
    try:
        spec = KernelSpecManager().get_kernel_spec(name)
        argv0 = spec.argv[0] if spec.argv else ""
        major, minor = sys.version_info[:2]
        if argv0 in {"python", f"python{major}", f"python{major}.{minor}"}:
            ok = True
        elif os.path.isabs(argv0) and _python_dir(argv0) == _python_dir(sys.executable):
            ok = True
    except Exception:  # no such kernel, broken spec: fall through to our own spec
        ok = False
    if ok:
        yield name
        return
    with tempfile.TemporaryDirectory(prefix="wmbook-kernels-") as tmp:
        kdir = Path(tmp) / "kernels" / name
        kdir.mkdir(parents=True)
        spec = {
            "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            "display_name": "Python 3 (wmbook)",
            "language": "python",
            "metadata": {"debugger": True},
        }
        (kdir / "kernel.json").write_text(json.dumps(spec, indent=1))
        old = os.environ.get("JUPYTER_PATH")
        os.environ["JUPYTER_PATH"] = tmp + (os.pathsep + old if old else "")
        try:
            yield name
        finally:
            if old is None:
                os.environ.pop("JUPYTER_PATH", None)
            else:
                os.environ["JUPYTER_PATH"] = old


def check_kernel(name: str) -> None:
    """InputError naming the installed kernels when no Jupyter kernelspec is called `name` (checked before any folder
    is made or kernel started)."""
    installed = sorted(KernelSpecManager().find_kernel_specs())
    if name not in installed:
        raise InputError(f"kernel={name!r} is not allowed: no such Jupyter kernel is installed; allowed values: "
                         f"{installed} (`jupyter kernelspec list`), or leave --kernel out for python3 of this "
                         f"interpreter")
