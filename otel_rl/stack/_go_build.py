"""Build the stack's Go programs from upstream modules: the collector distribution and Jaeger v2.

- The collector: the collector builder (ocb) of the manifest's release turns
  ``collector-config/builder-config.yaml`` into a ``main`` package and compiles it.
- Jaeger: ``github.com/jaegertracing/jaeger/cmd/jaeger`` at ``JAEGER_VERSION``, as a tool of a
  scratch module (``go get -tool``; its own ``go.mod`` has replace lines that ``go install
  module@version`` refuses).

Both need the ``go`` command (``OTEL_RL_GO`` names one that is not on PATH) and the Go module
proxy. A build is cached in ``<cache>/go/<program>-<key>/``, where the key is a digest of what
decides it (the manifest's text; Jaeger's version), so a new data folder (a test's) copies the
binary instead of building again; Go's own module and build caches make a rebuild after a change
cheap. One build at a time per cache folder (a file lock).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import yaml

import otel_rl.environment_variables as ENV
from otel_rl.stack._errors import InstallError
from otel_rl.stack.process import exclusive_lock, log_tail

JAEGER_MODULE = "github.com/jaegertracing/jaeger"
# The Go module's v1 tag of the Jaeger v2 release it builds (CHANGELOG: "v1.76.0 / v2.13.0").
JAEGER_VERSION = "v1.76.0"
JAEGER_RELEASE = "v2.13.0"
COLLECTOR_BUILDER = "go.opentelemetry.io/collector/cmd/builder"
COLLECTOR_MANIFEST = Path("collector-config") / "builder-config.yaml"
GO_MISSING = (
    "the `go` command is not on PATH (nor /usr/local/go/bin/go, nor OTEL_RL_GO): install Go 1.25 or newer "
    "(https://go.dev/dl/) and run the command again"
)
_PROGRESS_EVERY_S = 30.0


def find_go() -> Path | None:
    """The ``go`` command: ``OTEL_RL_GO``, else on PATH, else Go's default install folder."""
    explicit = os.environ.get(ENV.OTEL_RL_GO)
    if explicit:
        return Path(explicit) if os.access(explicit, os.X_OK) else None
    found = shutil.which("go") or ("/usr/local/go/bin/go" if os.access("/usr/local/go/bin/go", os.X_OK) else None)
    return Path(found) if found else None


@dataclass(frozen=True)
class CollectorManifest:
    """What the stack reads of the builder manifest."""

    path: Path
    text: str
    name: str  # dist.name: the binary's name
    version: str  # dist.version: the collector release, and the builder's version

    @classmethod
    def load(cls, path: Path) -> CollectorManifest:
        try:
            text = path.read_text()
            dist = (yaml.safe_load(text) or {}).get("dist") or {}
        except (OSError, yaml.YAMLError) as exc:
            raise InstallError(f"cannot read the collector builder manifest {path}: {exc}") from None
        name, version = str(dist.get("name") or ""), str(dist.get("version") or "")
        if not name or not version:
            raise InstallError(f"{path}: dist.name and dist.version must be set (the binary's name; the collector release)")
        return cls(path, text, name, version)

    @property
    def key(self) -> str:
        return hashlib.sha256(self.text.encode()).hexdigest()[:16]


def jaeger_key(version: str = JAEGER_VERSION) -> str:
    return hashlib.sha256(f"{JAEGER_MODULE}/cmd/jaeger@{version}".encode()).hexdigest()[:16]


class GoBuilder:
    """Builds into ``<cache_dir>/go`` and logs each build's output to ``log_dir/build-<program>.log``."""

    def __init__(self, cache_dir: Path, log_dir: Path, out: Callable[[], TextIO | None]):
        self.root = cache_dir / "go"
        self.log_dir = log_dir
        self._out = out

    def collector_path(self, manifest: CollectorManifest) -> Path:
        """Where the build of ``manifest`` is cached (it may not be built yet)."""
        return self.root / f"{manifest.name}-{manifest.key}" / manifest.name

    def jaeger_path(self, version: str = JAEGER_VERSION) -> Path:
        """Where Jaeger's build at ``version`` is cached (it may not be built yet)."""
        return self.root / f"jaeger-{jaeger_key(version)}" / "jaeger"

    def collector(self, manifest: CollectorManifest) -> Path:
        """The collector binary the manifest describes, built if no cached build has it."""
        binary = self.collector_path(manifest)
        folder = binary.parent
        with self._locked():
            if os.access(binary, os.X_OK):
                return binary
            go = self._go(manifest.name)
            log = self.log_dir / f"build-{manifest.name}.log"
            src = folder / "src"
            tools = self.root / "tools" / f"builder-v{manifest.version}"
            builder = tools / "builder"
            env = self._env(go)
            with self._progress(f"building {manifest.name} {manifest.version} from Go modules (first time: several minutes)"):
                if not os.access(builder, os.X_OK):
                    self._run(
                        f"installing the collector builder v{manifest.version}",
                        [str(go), "install", f"{COLLECTOR_BUILDER}@v{manifest.version}"],
                        log,
                        dict(env, GOBIN=str(tools)),
                    )
                # The manifest's own output path is relative to where it is run; the build goes to the cache.
                data = yaml.safe_load(manifest.text)
                data["dist"]["output_path"] = str(src)
                src.mkdir(parents=True, exist_ok=True)
                local = folder / "builder-config.yaml"
                local.write_text(yaml.safe_dump(data, sort_keys=False))
                self._run(
                    f"building {manifest.name} with {manifest.path}",
                    [str(builder), "--config", str(local), "--ldflags=-s -w"],
                    log,
                    env,
                    hint="the log shows which module failed; every module must be served by the Go module proxy at the manifest's release",
                )
            built = src / manifest.name
            if not os.access(built, os.X_OK):
                raise InstallError(f"the collector builder left no {built}; see {log}")
            built.replace(binary)
            shutil.rmtree(src, ignore_errors=True)  # the generated sources: Go's build cache keeps what matters
            return binary

    def jaeger(self, version: str = JAEGER_VERSION) -> Path:
        """Jaeger v2's binary at module ``version``, built if no cached build has it."""
        binary = self.jaeger_path(version)
        folder = binary.parent
        with self._locked():
            if os.access(binary, os.X_OK):
                return binary
            go = self._go("jaeger")
            log = self.log_dir / "build-jaeger.log"
            module = folder / "module"
            module.mkdir(parents=True, exist_ok=True)
            (module / "go.mod").write_text("module otel-rl.local/jaeger\n\ngo 1.25\n")
            env = self._env(go)
            with self._progress(f"building Jaeger ({JAEGER_MODULE} {version}) from Go modules (first time: several minutes)"):
                self._run(
                    f"resolving {JAEGER_MODULE}/cmd/jaeger@{version}",
                    [str(go), "get", "-tool", f"{JAEGER_MODULE}/cmd/jaeger@{version}"],
                    log,
                    env,
                    cwd=module,
                )
                self._run(
                    "building jaeger",
                    [str(go), "build", "-trimpath", f"-ldflags=-s -w -X {JAEGER_MODULE}/internal/version.latestVersion={JAEGER_RELEASE}"]
                    + ["-o", str(binary), f"{JAEGER_MODULE}/cmd/jaeger"],
                    log,
                    env,
                    cwd=module,
                )
            return binary

    # -- mechanics -----------------------------------------------------------------------------

    def _go(self, program: str) -> Path:
        go = find_go()
        if go is None:
            raise InstallError(f"{program} is built from Go modules and {GO_MISSING}")
        return go

    @staticmethod
    def _env(go: Path) -> dict[str, str]:
        # The go command's own folder first, so that the builder finds the same Go; module and build
        # caches stay Go's defaults (shared with the user's other builds).
        env = dict(os.environ, CGO_ENABLED="0", GOFLAGS="-buildvcs=false")
        env["PATH"] = f"{go.parent}{os.pathsep}{env.get('PATH', '')}"
        return env

    def _locked(self):
        return exclusive_lock(self.root / ".lock", lambda: self._say(f"waiting for another build in {self.root}..."))

    @contextmanager
    def _progress(self, what: str):
        """One line when a build starts, one every 30 s while it runs (builds print nothing for minutes)."""
        self._say(f"{what}...")
        begin = time.monotonic()
        done = threading.Event()

        def tick() -> None:
            while not done.wait(_PROGRESS_EVERY_S):
                self._say(f"  ... still building ({time.monotonic() - begin:.0f} s)")

        ticker = threading.Thread(target=tick, name="otel-rl-stack-build-progress", daemon=True)
        ticker.start()
        try:
            yield
        finally:
            done.set()
            ticker.join()
        self._say(f"  built in {time.monotonic() - begin:.0f} s")

    def _say(self, text: str) -> None:
        out = self._out()
        if out is not None:
            out.write(text + "\n")
            out.flush()

    @staticmethod
    def _run(step: str, command: list[str], log: Path, env: dict[str, str], *, cwd: Path | None = None, hint: str = "") -> None:
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "ab") as fh:
            fh.write(f"\n$ {' '.join(command)}\n".encode())
            fh.flush()
            rc = subprocess.run(command, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, cwd=cwd).returncode
        if rc != 0:
            raise InstallError(f"{step} failed (exit {rc}); last lines of {log}:\n{log_tail(log, 20)}\n{hint}".rstrip())
