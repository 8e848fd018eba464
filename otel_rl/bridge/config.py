"""The bridge's settings: the YAML file ``otel-rl bridge --config FILE`` reads, validated into a
:class:`BridgeConfig` whose errors name the file and the bad setting."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from otel_rl._sdk.settings.config import read_yaml_file
from otel_rl.trackers.fanout import KEY_STYLES, redact_tracker_kwargs

__all__ = ["DEFAULT_BASE_DIR", "DEFAULT_LISTEN", "BridgeConfig", "load_bridge_config", "parse_listen"]

DEFAULT_LISTEN = "127.0.0.1:4319"
DEFAULT_BASE_DIR = "otel-rl-bridge"


@dataclass(frozen=True)
class BridgeConfig:
    """The bridge's settings: the YAML file's keys (see ``otel-rl bridge --help``)."""

    track_with: str | tuple[str, ...]
    tracker_kwargs: dict[str, Any] = field(default_factory=dict, repr=False)  # holds credentials
    listen: str = DEFAULT_LISTEN
    tracker_keys: str = "original"
    ranks: tuple[int, ...] | None = (0,)  # None: every rank
    split_runs: bool = True
    base_dir: str = DEFAULT_BASE_DIR
    run_name: str | None = None
    max_queue_mb: float = 32.0
    metrics_fallback: bool = True
    metrics_fallback_after: int = 3
    imports: tuple[str, ...] = ()  # modules that register third-party trackers (register_tracker)
    run_idle_timeout_s: float = 600.0  # finish a run's trackers after this long without data; 0: never
    max_open_runs: int = 32  # runs with open trackers (threads, files); the least recently used is finished first
    max_requests_in_flight: int = 4  # requests read and decoded at once; beyond it 429 with Retry-After
    max_requests_per_client: int = 2  # of those, at most this many from one address (default: half of max_requests_in_flight)
    body_timeout_s: float = 5.0  # a request body that stops arriving for this long is answered 408 and its slot freed
    max_runs: int = 256  # runs (tracker folders) the bridge creates; records of further new run ids are dropped and counted
    max_connections: int = 256  # open connections (a thread each); beyond, an idle one of the busiest address gives way
    max_connections_per_client: int = 64  # of those, at most this many from one address
    max_run_mb: float = 1024.0  # what one run may hand its trackers (MiB of keys and values); beyond, 507
    max_record_kb: int = 1024  # one event's size (a step's values, a sample); a larger one is skipped and counted

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], source: str = "bridge config") -> BridgeConfig:
        """Validate a mapping of settings; a ValueError names the file and the bad key."""
        if not isinstance(data, Mapping):
            raise ValueError(f"{source}: expected a mapping of settings, got {type(data).__name__}")
        known = {f for f in cls.__dataclass_fields__}
        unknown = sorted(str(k) for k in data if k not in known)
        if unknown:
            raise ValueError(f"{source}: unknown setting(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")

        def bad(key: str, why: str) -> ValueError:
            return ValueError(f"{source}: {key}: {why}")

        track_with = data.get("track_with")
        if isinstance(track_with, str) and track_with.strip() and "," not in track_with:
            track_with = track_with.strip()
        elif isinstance(track_with, (str, list, tuple)) and all(isinstance(n, str) for n in track_with):
            items = track_with.split(",") if isinstance(track_with, str) else track_with
            track_with = tuple(dict.fromkeys(n.strip() for n in items if n.strip()))
            if len(track_with) == 1:
                track_with = track_with[0]
        else:
            track_with = None
        if not track_with:
            raise bad("track_with", "name the tracker(s) to feed, e.g. `track_with: tensorboard` or `[tensorboard, wandb]`")
        kwargs = data.get("tracker_kwargs") or {}
        if not isinstance(kwargs, Mapping):
            raise bad("tracker_kwargs", "expected a mapping (one tracker's settings, or tracker name -> settings)")
        listen = str(data.get("listen", DEFAULT_LISTEN))
        parse_listen(listen, source)
        keys = data.get("tracker_keys", "original")
        if keys not in KEY_STYLES:
            raise bad("tracker_keys", f"expected one of {', '.join(KEY_STYLES)}, got {keys!r}")
        ranks = _parse_ranks(data.get("ranks", 0), source)
        split = data.get("split_runs", True)
        fallback = data.get("metrics_fallback", True)
        for key, value in (("split_runs", split), ("metrics_fallback", fallback)):
            if not isinstance(value, bool):
                raise bad(key, f"expected true or false, got {value!r}")
        base_dir = data.get("base_dir", DEFAULT_BASE_DIR)
        if not isinstance(base_dir, str) or not base_dir:
            raise bad("base_dir", "expected a folder")
        run_name = data.get("run_name")
        if run_name is not None and (not isinstance(run_name, str) or not run_name):
            raise bad("run_name", "expected a non-empty string")
        queue_mb = data.get("max_queue_mb", 32.0)
        if isinstance(queue_mb, bool) or not isinstance(queue_mb, (int, float)) or not queue_mb > 0:
            raise bad("max_queue_mb", f"expected a positive number, got {queue_mb!r}")
        after = data.get("metrics_fallback_after", 3)
        if isinstance(after, bool) or not isinstance(after, int) or after < 0:
            raise bad("metrics_fallback_after", f"expected a non-negative integer, got {after!r}")
        idle = data.get("run_idle_timeout_s", 600.0)
        if isinstance(idle, bool) or not isinstance(idle, (int, float)) or idle < 0:
            raise bad("run_idle_timeout_s", f"expected seconds (0: never), got {idle!r}")
        caps = {}
        in_flight = data.get("max_requests_in_flight", 4)
        for key, default in (
            ("max_open_runs", 32),
            ("max_requests_in_flight", 4),
            ("max_requests_per_client", max(1, in_flight // 2) if isinstance(in_flight, int) else 1),
            ("max_runs", 256),
            ("max_connections", 256),
            ("max_connections_per_client", 64),
            ("max_record_kb", 1024),
        ):
            value = data.get(key, default)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise bad(key, f"expected a positive integer, got {value!r}")
            caps[key] = value
        if caps["max_requests_per_client"] > caps["max_requests_in_flight"]:
            raise bad(
                "max_requests_per_client",
                f"expected at most max_requests_in_flight ({caps['max_requests_in_flight']}), got {caps['max_requests_per_client']}",
            )
        run_mb = data.get("max_run_mb", 1024.0)
        if isinstance(run_mb, bool) or not isinstance(run_mb, (int, float)) or not 0 < run_mb < float("inf"):
            raise bad("max_run_mb", f"expected a positive number of MiB (e.g. 1024), got {run_mb!r}")
        body_timeout = data.get("body_timeout_s", 5.0)
        if isinstance(body_timeout, bool) or not isinstance(body_timeout, (int, float)) or not 0 < body_timeout <= 600:
            raise bad("body_timeout_s", f"expected seconds between 0 and 600 (e.g. 5), got {body_timeout!r}")
        imports = data.get("imports") or ()
        imports = [imports] if isinstance(imports, str) else imports
        if not isinstance(imports, (list, tuple)) or not all(isinstance(m, str) and m for m in imports):
            raise bad("imports", f"expected module names (e.g. [my_pkg.trackers]), got {imports!r}")
        return cls(
            track_with=track_with,
            tracker_kwargs=dict(kwargs),
            listen=listen,
            tracker_keys=keys,
            ranks=ranks,
            split_runs=split,
            base_dir=base_dir,
            run_name=run_name,
            max_queue_mb=float(queue_mb),
            metrics_fallback=fallback,
            metrics_fallback_after=after,
            imports=tuple(imports),
            run_idle_timeout_s=float(idle),
            max_open_runs=caps["max_open_runs"],
            max_requests_in_flight=caps["max_requests_in_flight"],
            max_requests_per_client=caps["max_requests_per_client"],
            body_timeout_s=float(body_timeout),
            max_runs=caps["max_runs"],
            max_connections=caps["max_connections"],
            max_connections_per_client=caps["max_connections_per_client"],
            max_run_mb=float(run_mb),
            max_record_kb=caps["max_record_kb"],
        )

    def public_dict(self) -> dict[str, Any]:
        """The settings, safe to print: tracker secrets masked."""
        out = {k: getattr(self, k) for k in self.__dataclass_fields__ if k != "tracker_kwargs"}
        out["tracker_kwargs"] = redact_tracker_kwargs(self.track_with, self.tracker_kwargs)
        return out


def _parse_ranks(raw: Any, source: str) -> tuple[int, ...] | None:
    if isinstance(raw, str) and raw.strip().lower() == "all":
        return None
    items = raw if isinstance(raw, (list, tuple)) else [raw]
    if not items or not all(isinstance(r, int) and not isinstance(r, bool) and r >= 0 for r in items):
        raise ValueError(f"{source}: ranks: expected `all`, a rank (0) or a list of ranks ([0, 8]), got {raw!r}")
    return tuple(sorted(set(cast("list[int]", items))))  # checked above: all non-negative ints


def parse_listen(listen: str, source: str = "listen") -> tuple[str, int]:
    """``host:port`` (``[::1]:4319`` for IPv6) as (host, port)."""
    match = re.fullmatch(r"\[([0-9A-Fa-f:.]+)\]:(\d+)|([^:\[\]]+):(\d+)", listen.strip())
    if not match:
        raise ValueError(f"{source}: listen: expected HOST:PORT (e.g. {DEFAULT_LISTEN}), got {listen!r}")
    host = match.group(1) or match.group(3)
    port = int(match.group(2) or match.group(4))
    if port > 65535:
        raise ValueError(f"{source}: listen: port {port} is not in 0..65535")
    return host, port


def load_bridge_config(path: str | Path) -> BridgeConfig:
    """Read the bridge's YAML file; errors name the file and the setting."""
    p = Path(path)
    data = read_yaml_file(p, "bridge config")
    return BridgeConfig.from_mapping(data if data is not None else {}, f"bridge config {p}")
