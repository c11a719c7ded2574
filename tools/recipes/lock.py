"""Write a Python lock rsim's `[environment] kind = "python"` takes: every distribution the
requirements need, pinned exactly, with the sha256 of the wheel pip chose for this platform.

    python3 tools/recipes/lock.py REQUIREMENTS.in LOCK [--wheels DIR]

It runs `pip download --only-binary=:all:` (from pip's configured index) into DIR (a temporary
folder unless given) and hashes what came. The lock is for the platform and interpreter it was
made on (wheels differ between them); make one per platform a study's jobs run on.
"""
import hashlib
import re
import subprocess
import sys
import tempfile
from pathlib import Path


def main() -> None:
    args = sys.argv[1:]
    wheels = None
    if "--wheels" in args:
        i = args.index("--wheels")
        wheels = args[i + 1]
        del args[i : i + 2]
    if len(args) != 2:
        sys.exit("usage: lock.py REQUIREMENTS.in LOCK [--wheels DIR]")
    req, lock = args
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(wheels or tmp)
        subprocess.run([sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "-q",
                        "--only-binary=:all:", "-d", str(d), "-r", req], check=True, stdout=sys.stderr)
        pins = {}
        for w in sorted(d.glob("*.whl")):
            # {distribution}-{version}(-{build})?-{python}-{abi}-{platform}.whl
            dist, version = w.name.split("-")[:2]
            name = re.sub(r"[-_.]+", "-", dist).lower()
            if name in pins and pins[name][0] != version:
                sys.exit(f"{w.name}: {name} downloaded at two versions ({pins[name][0]}, {version})")
            sha = hashlib.sha256(w.read_bytes()).hexdigest()
            pins.setdefault(name, (version, []))[1].append(sha)
    lines = [f"# Made by tools/recipes/lock.py from {Path(req).name} for Python "
             f"{sys.version_info.major}.{sys.version_info.minor} on this platform; rsim installs it with\n"
             "# pip install --require-hashes --no-deps.\n"]
    for name, (version, shas) in sorted(pins.items()):
        hashes = " \\\n".join(f"    --hash=sha256:{s}" for s in sorted(set(shas)))
        lines.append(f"{name}=={version} \\\n{hashes}\n")
    Path(lock).write_text("".join(lines))
    print(f"{lock}: {len(pins)} distributions", file=sys.stderr)


if __name__ == "__main__":
    main()
