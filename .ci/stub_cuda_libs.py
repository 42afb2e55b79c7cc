#!/usr/bin/env python
"""Stub shared libraries for the CUDA libraries a PyPI torch wheel links against, so that the wheel imports and runs
on a CPU-only machine without its nvidia-* dependencies (GBs): the lowest-versions venv of .ci/lowest_versions.sh.

PyPI's Linux torch wheels before 2.13 are CUDA builds: libtorch_cuda.so and friends name libcudart, libcublas,
libcudnn, ... as NEEDED libraries, with versioned symbols, and Python loads extension modules with RTLD_NOW. For
every NEEDED library of torch/lib/*.so that the dynamic linker cannot find, this writes a stub of that name that
defines the version nodes torch requires and every symbol torch takes from it (functions that return 0, data of 64
zero bytes). CUDA is never initialized on a CPU run (``torch.cuda.is_available()`` asks libcudart, whose stub answers
"no device": cudaGetDeviceCount returns an error code), so no stub function does work that matters.

    python .ci/stub_cuda_libs.py <venv>/lib/python3.X/site-packages/torch/lib <stub folder>
    LD_LIBRARY_PATH=<stub folder> python -c "import torch"
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path


def _run(*command: str) -> str:
    return subprocess.run(command, capture_output=True, text=True, check=True).stdout


def missing_libraries(torch_lib: Path) -> set[str]:
    """NEEDED libraries of torch/lib/*.so that ldd cannot find (with the stubs folder not on the path)."""
    missing = set()
    for library in torch_lib.glob("*.so*"):
        for line in _run("ldd", str(library)).splitlines():
            if "=> not found" in line:
                missing.add(line.split()[0])
    return missing


def version_owners(library: Path) -> dict[str, str]:
    """{version name: the library file that must define it} from the version-needs section (readelf -V)."""
    owners, current = {}, None
    for line in _run("readelf", "-V", "-W", str(library)).splitlines():
        found = re.search(r"File: (\S+)", line)
        if found:
            current = found.group(1)
            continue
        found = re.search(r"Name: (\S+)", line)
        if found and current:
            owners[found.group(1)] = current
    return owners


def defined_symbols(paths) -> set[str]:
    names = set()
    for path in paths:
        for line in _run("nm", "-D", "--defined-only", str(path)).splitlines():
            names.add(line.split()[-1].split("@")[0])
    return names


def stub_symbols(torch_lib: Path, missing: set[str]) -> dict[str, dict[str, set[str]]]:
    """{missing library: {version name or "": symbols}}: what each stub must define."""
    libraries = sorted(torch_lib.glob("*.so*"))
    present = defined_symbols(libraries)
    for library in libraries:  # the system libraries torch links (libc, libstdc++, libgomp, ...)
        for line in _run("ldd", str(library)).splitlines():
            parts = line.split("=>")
            if len(parts) == 2 and parts[1].strip().startswith("/"):
                present |= defined_symbols([parts[1].split()[0]])
    wanted: dict[str, dict[str, set[str]]] = {name: defaultdict(set) for name in missing}
    fallback = sorted(missing)[0]
    for library in libraries:
        owners = version_owners(library)
        for line in _run("nm", "-D", "--undefined-only", str(library)).splitlines():
            kind, symbol = line.split()[-2:]
            if kind == "w":
                continue  # weak: may stay undefined
            name, _, version = symbol.partition("@")
            owner = owners.get(version)
            if owner in missing:
                wanted[owner][version].add(name)
            elif not version and name not in present:
                wanted[fallback][""].add(name)  # unversioned and found nowhere: any stub may define it
    return wanted


def write_stub(name: str, versions: dict[str, set[str]], folder: Path) -> None:
    source, script = [], []
    for version, names in sorted(versions.items()):
        for symbol in sorted(names):
            source.append(f'int {symbol}(void) {{ return {1 if "GetDeviceCount" in symbol else 0}; }}')
        if version:
            script.append(f'{version} {{ global: {"; ".join(sorted(names))}; }};')
    if not script:
        script.append("STUB { global: *; };")
    c_file, map_file = folder / f"{name}.c", folder / f"{name}.map"
    c_file.write_text("\n".join(source) + "\n")
    map_file.write_text("\n".join(script) + "\n")
    subprocess.run(["gcc", "-shared", "-fPIC", "-w", "-o", str(folder / name), str(c_file), f"-Wl,-soname,{name}",
                    f"-Wl,--version-script={map_file}"], check=True)
    c_file.unlink()
    map_file.unlink()


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    torch_lib, folder = Path(argv[0]), Path(argv[1])
    folder.mkdir(parents=True, exist_ok=True)
    missing = missing_libraries(torch_lib)
    for name, versions in stub_symbols(torch_lib, missing).items():
        write_stub(name, versions, folder)
    print(f"{len(missing)} stub libraries in {folder}: {' '.join(sorted(missing))}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
