"""PromQL as the dashboards write and read it: label matchers, rates and quantiles, legends, and a
small reader that finds the metric names an expression selects and fills in Grafana's template variables.

Nothing here knows the registry: attributes come in as OTel names (``rl.stage``) and leave as
Prometheus labels (``rl_stage``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

# --------------------------------------------------------------------------------------------
# Labels and matchers


def label(attribute: str) -> str:
    """The Prometheus label an OTel attribute becomes (``rl.stage`` -> ``rl_stage``)."""
    return re.sub(r"[^a-zA-Z0-9_]", "_", attribute)


def eq(attribute: str, value: str) -> str:
    return f'{label(attribute)}="{value}"'


def ne(attribute: str, value: str) -> str:
    return f'{label(attribute)}!="{value}"'


def match(attribute: str, pattern: str) -> str:
    return f'{label(attribute)}=~"{pattern}"'


def one_of(values: Iterable[Any]) -> str:
    """A regex alternation of enum values (``generate|rollout``)."""
    return "|".join(re.escape(str(getattr(v, "value", v))) for v in values)


def enum_value(enum_member: Any) -> str:
    """An enum member's value as a label value (a plain string stays as it is)."""
    return str(getattr(enum_member, "value", enum_member))


# --------------------------------------------------------------------------------------------
# Functions and aggregations


def rate(selector: str, window: str = "$__rate_interval") -> str:
    return f"rate({selector}[{window}])"


def increase(selector: str, window: str = "$__rate_interval") -> str:
    return f"increase({selector}[{window}])"


def grown(selector: str, window: str = "$__rate_interval") -> str:
    """How much a cumulative series grew in the window, counting a series that first appeared in it.

    The OTel SDK creates a histogram's or counter's series at its first recording, so the first
    checkpoint, validation or NaN would be invisible to increase() alone (it needs two samples):
    a series absent one window ago grew by its whole value.
    """
    return f"(increase({selector}[{window}]) or ({selector} unless {selector} offset {window}))"


def mean_per_call(histogram_sum: str, histogram_count: str, group: Sequence[str], window: str = "$__rate_interval") -> str:
    """Mean value per observation in the window (seconds per stage call), per group."""
    total = f"sum {by(*group)} " if group else "sum"
    return f"{total}({grown(histogram_sum, window)}) / {total}({grown(histogram_count, window)})"


def quantile(q: float, buckets: str, by: Sequence[str] = ()) -> str:
    """histogram_quantile over a histogram's _bucket selector, grouped by the given attributes.

    Only series that have finite buckets count: under the series budget a rank other than the
    lead sends an ``own`` histogram as its sum and count (one +Inf bucket), which would otherwise
    pile its calls into the top bucket of the sum.
    """
    labels = ", ".join(["le", *(label(a) for a in by)])
    finite = with_matcher(buckets, 'le!="+Inf"')
    bucketed = f"{rate(buckets)} and ignoring (le) {finite}"
    return f"histogram_quantile({q}, sum by ({labels}) ({bucketed}))"


def with_matcher(selector: str, matcher: str) -> str:
    """``selector`` (``name`` or ``name{...}``) with one more label matcher."""
    if selector.endswith("}"):
        head = selector[:-1].rstrip()
        return f"{head}{'' if head.endswith('{') else ', '}{matcher}}}"
    return f"{selector}{{{matcher}}}"


def by(*attributes: str) -> str:
    return f"by ({', '.join(label(a) for a in attributes)})"


def legend(*attributes: str, prefix: str = "") -> str:
    """A legend template such as ``{{rl_stage}} {{rl_cluster}}``."""
    return (prefix + " ".join("{{" + label(a) + "}}" for a in attributes)).strip()


# --------------------------------------------------------------------------------------------
# Reading expressions (metric names, template variables)

_PROMQL_TOKEN = re.compile(
    r"""
    (?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`)
  | (?P<range>\[[^\]]*\])
  | (?P<variable>\$\{[^}]*\}|\$[A-Za-z_]\w*)
  | (?P<number>\d+(?:\.\d+)?(?:[eE][+-]?\d+)?(?:ms|[smhdwy])?(?![\w.]))
  | (?P<ident>[A-Za-z_:][A-Za-z0-9_:]*)
  | (?P<open>[({])
  | (?P<close>[)}])
  | (?P<other>\S)
""",
    re.VERBOSE,
)
_PROMQL_KEYWORDS = {
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "offset",
    "and",
    "or",
    "unless",
    "inf",
    "nan",
    "atan2",
}
_LABEL_LISTS = {"by", "without", "on", "ignoring", "group_left", "group_right"}


def promql_metric_names(expr: str) -> list[str]:
    """Metric names an expression selects, in order (label matchers, label lists and functions skipped)."""
    tokens = [(m.lastgroup, m.group()) for m in _PROMQL_TOKEN.finditer(expr)]
    names: list[str] = []
    i, braces = 0, 0
    while i < len(tokens):
        kind, text = tokens[i]
        following = tokens[i + 1] if i + 1 < len(tokens) else (None, "")
        if kind == "open" and text == "{":
            braces += 1
        elif kind == "close" and text == "}":
            braces -= 1
        elif kind == "ident" and not braces:
            if text.lower() in _LABEL_LISTS and following == ("open", "("):
                while i < len(tokens) and tokens[i] != ("close", ")"):  # a label list: (le, rl_stage)
                    i += 1
            elif (
                following == ("open", "(")
                or text.lower() in _PROMQL_KEYWORDS
                or (following[0] == "ident" and following[1].lower() in ("by", "without"))
            ):
                pass  # a function call, an aggregation (sum by (...) (...)) or an operator keyword
            elif text not in names:
                names.append(text)
        i += 1
    return names


def substitute(expr: str, values: Mapping[str, str]) -> str:
    """An expression with Grafana's template variables (``$run``, ``${run}``, ``$__rate_interval``) replaced."""

    def one(found: re.Match) -> str:
        name = (found.group(1) or found.group(2)).split(":")[0]
        if name not in values:
            raise KeyError(f"no value for ${name} in {expr!r}")
        return values[name]

    return re.sub(r"\$\{([^}]+)\}|\$(\w+)", one, expr)
