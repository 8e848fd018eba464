"""Install the stack's servers into its data folder: from Debian's archive, and built from Go modules.

Nothing here changes the system: Debian packages are fetched with a scratch apt set-up that lives
in ``<data>/apt`` (its own sources list naming a suite of the mirror the system already uses, its
own state and cache, the system's Debian archive keyring for signatures; /etc/apt is only read) and
unpacked with ``dpkg-deb -x`` into ``<data>/debs/<package>``; the collector and Jaeger are built
with Go (_go_build.py) and copied to ``<data>/bin``. Downloaded ``.deb`` files and built binaries
are kept in the cache folder (``OTEL_RL_STACK_CACHE``, default ``~/.cache/otel-rl/stack``) so that a
new data folder neither downloads nor builds them again. ``<data>/install.json`` records what was
installed, so installing again is a no-op.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import otel_rl.environment_variables as ENV
from otel_rl.stack._errors import InstallError
from otel_rl.stack._go_build import COLLECTOR_MANIFEST, JAEGER_RELEASE, JAEGER_VERSION, CollectorManifest, GoBuilder, jaeger_key
from otel_rl.stack.process import log_tail

DEBIAN_KEYRING = Path("/usr/share/keyrings/debian-archive-keyring.gpg")
# Suites the scratch sources list names: VictoriaMetrics needs trixie's (bookworm's 1.79 has no
# OTLP ingestion); Prometheus comes from bookworm (2.42) as on the rest of these machines.
SCRATCH_SUITES = ("trixie", "bookworm")
# Settings of the system's apt worth keeping in the scratch set-up (proxies, date checks of a
# snapshot mirror); its hooks (APT::Update::Post-Invoke and the like) are deliberately not read.
_FORWARDED_APT_OPTIONS = (
    "Acquire::http::Proxy",
    "Acquire::https::Proxy",
    "Acquire::ftp::Proxy",
    "Acquire::Check-Valid-Until",
    "Acquire::Check-Date",
    "Acquire::Retries",
    "Acquire::ForceIPv4",
    "Acquire::ForceIPv6",
    "Acquire::http::Timeout",
    "Acquire::https::Timeout",
)


@dataclass(frozen=True)
class Package:
    """One thing to install: a Debian package (unpacked) or a program built from Go modules."""

    name: str
    source: str  # "debian" or "go"
    spec: str  # Debian package name, or what the Go build takes (the manifest; module@version)
    suite: str = ""  # Debian suite to take it from
    binaries: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        return f"Debian {self.suite}" if self.source == "debian" else f"Go modules: {self.spec}"


PACKAGES: dict[str, Package] = {
    "otelcol": Package("otelcol", "go", str(COLLECTOR_MANIFEST), binaries=("otelcol-rl",)),
    "jaeger": Package("jaeger", "go", f"github.com/jaegertracing/jaeger/cmd/jaeger@{JAEGER_VERSION}", binaries=("jaeger",)),
    "victoria-metrics": Package("victoria-metrics", "debian", "victoria-metrics", "trixie", binaries=("victoria-metrics", "vmalert")),
    "prometheus": Package("prometheus", "debian", "prometheus", "bookworm", binaries=("prometheus", "promtool")),
}


def default_cache_dir() -> Path:
    """``OTEL_RL_STACK_CACHE``, else ``$XDG_CACHE_HOME/otel-rl/stack`` (``~/.cache/otel-rl/stack``)."""
    explicit = os.environ.get(ENV.OTEL_RL_STACK_CACHE)
    if explicit:
        return Path(explicit).expanduser().resolve()
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return (base / "otel-rl" / "stack").resolve()


# ---------------------------------------------------------------------------------------------
# The system's Debian mirror and the scratch apt set-up


def _deb822_stanzas(text: str) -> Iterable[dict[str, str]]:
    stanza: dict[str, str] = {}
    key = ""
    for line in text.splitlines() + [""]:
        if line.startswith("#"):
            continue
        if not line.strip():
            if stanza:
                yield stanza
            stanza, key = {}, ""
        elif line[0] in " \t" and key:
            stanza[key] += " " + line.strip()
        elif ":" in line:
            key, _, value = line.partition(":")
            key = key.strip().lower()
            stanza[key] = value.strip()


_DEBIAN_SUITE = re.compile(
    r"^(oldoldstable|oldstable|stable|testing|unstable|sid|experimental|"
    r"buster|bullseye|bookworm|trixie|forky|duke)(-updates|-backports|-proposed-updates)?$"
)


def system_debian_mirror(etc_apt: Path = Path("/etc/apt")) -> str:
    """The URI of the Debian archive the system's apt sources use (deb822 ``*.sources`` or one-line lists).

    Security and third-party repositories are skipped. Raises InstallError when none names Debian's archive.
    """
    candidates: list[str] = []
    parts = etc_apt / "sources.list.d"
    for path in sorted(parts.glob("*.sources")) if parts.is_dir() else []:
        for stanza in _deb822_stanzas(path.read_text(errors="replace")):
            if stanza.get("enabled", "yes").lower() == "no" or "deb" not in stanza.get("types", "").split():
                continue
            suites = stanza.get("suites", "").split()
            if any(_DEBIAN_SUITE.match(s) for s in suites):
                candidates += stanza.get("uris", "").split()
    lists = [etc_apt / "sources.list", *(sorted(parts.glob("*.list")) if parts.is_dir() else [])]
    for path in lists:
        if not path.is_file():
            continue
        for line in path.read_text(errors="replace").splitlines():
            line = line.split("#", 1)[0].strip()
            fields = re.sub(r"\[[^\]]*\]", " ", line).split()
            if len(fields) >= 3 and fields[0] == "deb" and _DEBIAN_SUITE.match(fields[2]):
                candidates.append(fields[1])
    for uri in candidates:
        if not uri.rstrip("/").endswith("-security"):
            return uri.rstrip("/")
    raise InstallError(
        f"no Debian archive found in the apt sources under {etc_apt} (sources.list.d/*.sources or sources.list); "
        "the stack fetches VictoriaMetrics and Prometheus from the mirror the system already uses. "
        "On a system without Debian's apt, install victoria-metrics (>= 1.100, with OTLP) and prometheus yourself"
    )


def _system_apt_options() -> list[str]:
    """Proxy and date-check settings of the system's apt configuration, as apt.conf lines."""
    env = {k: v for k, v in os.environ.items() if k != "APT_CONFIG"}
    try:
        dump = subprocess.run(["apt-config", "dump"], capture_output=True, text=True, env=env, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    keep = []
    for line in dump.splitlines():
        key = line.split(" ", 1)[0]
        if any(key == opt or key.startswith(opt + "::") for opt in _FORWARDED_APT_OPTIONS):
            keep.append(line if line.endswith(";") else line + ";")
    return keep


def write_scratch_apt(
    root: Path, *, mirror: str, suites: Iterable[str] = SCRATCH_SUITES, keyring: Path = DEBIAN_KEYRING, forward: Iterable[str] = ()
) -> Path:
    """Write a self-contained apt configuration under ``root``; return the file to pass as APT_CONFIG.

    apt reads APT_CONFIG before anything else, and this file points every Dir::Etc, Dir::State and
    Dir::Cache setting at ``root``, so neither /etc/apt's other files nor the system's package lists,
    caches or dpkg status are read or written.
    """
    root = root.resolve()
    for sub in ("apt.conf.d", "preferences.d", "trusted.gpg.d", "state/lists/partial", "cache/archives/partial", "log"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    (root / "state" / "status").touch()
    sources = root / "sources.list"
    sources.write_text("".join(f"deb [signed-by={keyring}] {mirror} {suite} main\n" for suite in suites))
    conf = root / "apt.conf"
    lines = [
        "// Written by otel-rl stack: a scratch apt set-up that leaves the system's apt untouched.",
        f'Dir::State "{root}/state";',
        f'Dir::State::status "{root}/state/status";',
        f'Dir::Cache "{root}/cache";',
        f'Dir::Log "{root}/log";',
        f'Dir::Etc::main "{conf}";',
        f'Dir::Etc::Parts "{root}/apt.conf.d";',
        f'Dir::Etc::SourceList "{sources}";',
        'Dir::Etc::SourceParts "/dev/null";',
        f'Dir::Etc::Preferences "{root}/preferences";',
        f'Dir::Etc::PreferencesParts "{root}/preferences.d";',
        f'Dir::Etc::Trusted "{keyring}";',
        f'Dir::Etc::TrustedParts "{root}/trusted.gpg.d";',
        'Acquire::Languages "none";',
        'APT::Sandbox::User "root";',  # as root: download as root into our folders (not as _apt)
        *forward,
    ]
    conf.write_text("\n".join(lines) + "\n")
    return conf


# ---------------------------------------------------------------------------------------------
# The installer


class Installer:
    """Installs packages into ``data_dir`` (see the module doc); ``out`` gets one progress line per step."""

    def __init__(self, data_dir: Path, cache_dir: Path, out: Callable[[], TextIO | None], collector_manifest: Path | None = None):
        self.data_dir = data_dir
        self.cache_dir = cache_dir
        self._out = out
        self.manifest_path = data_dir / "install.json"
        self.collector_manifest = collector_manifest  # collector-config/builder-config.yaml of the checkout

    # -- queries -------------------------------------------------------------------------------

    def manifest(self) -> dict[str, dict]:
        try:
            return dict(json.loads(self.manifest_path.read_text()))
        except (OSError, ValueError):
            return {}

    def binary(self, package: str, name: str) -> Path:
        """Where ``name`` of ``package`` is (or would be) once installed."""
        pkg = PACKAGES[package]
        if pkg.source == "debian":
            return self.data_dir / "debs" / package / "usr" / "bin" / name
        return self.data_dir / "bin" / name

    def build_key(self, package: str) -> str:
        """What a Go build of ``package`` is built from, as a digest ("" for Debian packages)."""
        if package == "otelcol":
            return CollectorManifest.load(self._collector_manifest()).key
        if package == "jaeger":
            return jaeger_key()
        return ""

    def is_installed(self, package: str) -> bool:
        """Installed, and for a Go build built from what the checkout asks for now (its manifest, Jaeger's version)."""
        pkg = PACKAGES[package]
        entry = self.manifest().get(package)
        if not entry:
            return False
        if pkg.source == "go":
            try:
                if entry.get("build_key") != self.build_key(package):
                    return False
            except InstallError:
                pass  # no manifest to compare with (outside a checkout): what is installed runs
        return all(os.access(self.binary(package, b), os.X_OK) for b in pkg.binaries)

    def _collector_manifest(self) -> Path:
        if self.collector_manifest is not None:
            return self.collector_manifest
        from otel_rl.stack._components import find_in_repository

        found = find_in_repository(str(COLLECTOR_MANIFEST))
        if found is None:
            raise InstallError(
                f"the collector is built from {COLLECTOR_MANIFEST} of an otel-rl checkout, and none was found from here "
                "or beside otel_rl: run from a checkout (git clone ...), or pass --collector-config with a checkout's collector-config/otelcol"
            )
        return found

    # -- install -------------------------------------------------------------------------------

    def install(self, packages: Iterable[str]) -> dict[str, str]:
        """Install what is missing of ``packages``; return {package: version} for all of them."""
        versions = {}
        for name in packages:
            if not self.is_installed(name):
                self._install_one(PACKAGES[name])
            versions[name] = str(self.manifest()[name].get("version", "?"))
        return versions

    def _install_one(self, pkg: Package) -> None:
        started = time.monotonic()
        # A build prints its own progress lines: its "done" goes on a line of its own.
        self._say(f"installing {pkg.name} ({pkg.label})... ", end="\n" if pkg.source == "go" else "")
        try:
            entry = self._install_debian(pkg) if pkg.source == "debian" else self._install_go(pkg)
        except InstallError:
            self._say("failed")
            raise
        missing = [b for b in pkg.binaries if not os.access(self.binary(pkg.name, b), os.X_OK)]
        if missing:
            self._say("failed")
            raise InstallError(
                f"installing {pkg.name}: {', '.join(missing)} not found after install "
                f"(looked at {self.binary(pkg.name, missing[0])}); remove {self.data_dir} and try again"
            )
        seconds = time.monotonic() - started
        entry.update(installed_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"), install_seconds=round(seconds, 1))
        manifest = self.manifest()
        manifest[pkg.name] = entry
        tmp = self.manifest_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
        tmp.replace(self.manifest_path)
        self._say(f"done in {format_seconds(seconds)} ({entry['version']})")

    def _say(self, text: str, end: str = "\n") -> None:
        out = self._out()
        if out is not None:
            out.write(text + end)
            out.flush()

    def _run(
        self, step: str, command: list[str], *, log: Path, env: dict[str, str] | None = None, cwd: Path | None = None, hint: str = ""
    ) -> None:
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "ab") as fh:
            fh.write(f"\n$ {' '.join(command)}\n".encode())
            fh.flush()
            try:
                rc = subprocess.run(
                    command, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, cwd=str(cwd) if cwd else None
                ).returncode
            except FileNotFoundError:
                raise InstallError(f"{step}: `{command[0]}` is not on this system. {hint}".rstrip()) from None
        if rc != 0:
            tail = log_tail(log, 20)
            raise InstallError(f"{step} failed (`{' '.join(command)}` exited {rc}); last lines of {log}:\n{tail}\n{hint}".rstrip())

    # Debian: scratch apt -> cached .deb -> dpkg-deb -x

    def _install_debian(self, pkg: Package) -> dict:
        for tool in ("apt-get", "dpkg-deb"):
            if shutil.which(tool) is None:
                raise InstallError(
                    f"installing {pkg.name}: `{tool}` is not on this system; the stack takes "
                    f"{pkg.name} from Debian's archive. Install {pkg.name} yourself on other systems"
                )
        log = self.data_dir / "logs" / f"install-{pkg.name}.log"
        deb = self._cached_deb(pkg)
        if deb is None:
            deb = self._download_deb(pkg, log)
        dest = self.data_dir / "debs" / pkg.name
        if dest.exists():
            shutil.rmtree(dest)
        dest.mkdir(parents=True)
        self._run(
            f"unpacking {deb.name}",
            ["dpkg-deb", "-x", str(deb), str(dest)],
            log=log,
            hint=f"the cached file may be damaged: delete {deb} and try again",
        )
        version = subprocess.run(["dpkg-deb", "-f", str(deb), "Version"], capture_output=True, text=True).stdout.strip()
        return {"source": "debian", "suite": pkg.suite, "package": pkg.spec, "version": version, "deb": str(deb), "path": str(dest)}

    def _cached_deb(self, pkg: Package) -> Path | None:
        folder = self.cache_dir / "debs" / pkg.suite
        for deb in sorted(folder.glob(f"{pkg.spec}_*.deb"), key=lambda p: p.stat().st_mtime, reverse=True):
            ok = subprocess.run(["dpkg-deb", "--info", str(deb)], capture_output=True).returncode == 0
            if ok:
                return deb
            deb.unlink(missing_ok=True)  # a damaged download: fetch it again
        return None

    def _download_deb(self, pkg: Package, log: Path) -> Path:
        if not DEBIAN_KEYRING.is_file():
            raise InstallError(
                f"installing {pkg.name}: Debian's archive keyring {DEBIAN_KEYRING} is missing, so "
                "signatures cannot be checked; it comes with the debian-archive-keyring package"
            )
        mirror = system_debian_mirror()
        conf = write_scratch_apt(self.data_dir / "apt", mirror=mirror, forward=_system_apt_options())
        env = {k: v for k, v in os.environ.items() if not k.startswith("APT_")}
        env.update(APT_CONFIG=str(conf), LC_ALL="C", DEBIAN_FRONTEND="noninteractive")
        hint = (
            f"check that {mirror} is reachable (the mirror in /etc/apt/sources.list.d) and that its "
            f"{pkg.suite} suite has {pkg.spec}; the scratch apt set-up is in {conf.parent}"
        )
        self._run(
            f"apt-get update (scratch sources: {', '.join(SCRATCH_SUITES)} of {mirror})",
            ["apt-get", "-q", "update"],
            log=log,
            env=env,
            hint=hint,
        )
        folder = self.cache_dir / "debs" / pkg.suite
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=folder, prefix=".download-") as tmp:
            self._run(
                f"apt-get download {pkg.spec}/{pkg.suite}",
                ["apt-get", "-q", "download", f"{pkg.spec}/{pkg.suite}"],
                log=log,
                env=env,
                cwd=Path(tmp),
                hint=hint,
            )
            got = sorted(Path(tmp).glob(f"{pkg.spec}_*.deb"))
            if not got:
                raise InstallError(f"apt-get download {pkg.spec}/{pkg.suite} left no .deb in {tmp}; see {log}")
            final = folder / got[0].name
            got[0].replace(final)  # only a complete, verified download lands in the cache
        return final

    # Go: build into the cache (or find the cached build), copy into <data>/bin

    def _install_go(self, pkg: Package) -> dict:
        builder = GoBuilder(self.cache_dir, self.data_dir / "logs", self._out)
        if pkg.name == "otelcol":
            manifest = CollectorManifest.load(self._collector_manifest())
            built, spec, version = builder.collector(manifest), str(manifest.path), manifest.version
        else:
            built, spec, version = builder.jaeger(), pkg.spec, JAEGER_RELEASE
        target = self.binary(pkg.name, pkg.binaries[0])
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.tmp")
        shutil.copy2(built, tmp)  # a copy, not a link: a later build in the cache never changes a running stack
        tmp.replace(target)
        return {
            "source": "go",
            "spec": spec,
            "build_key": self.build_key(pkg.name),
            "version": version,
            "cached": str(built),
            "path": str(target),
        }


def format_seconds(seconds: float) -> str:
    return f"{seconds:.1f} s" if seconds < 10 else f"{seconds:.0f} s"
