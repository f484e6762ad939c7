"""What one knob's value must be: the patterns, the pins' rule, the known-bad image catalogue,
the type of a ``known_bad_baselines`` entry and ``KnobChecks``, the field checks ``Knobs``
(sparkrig/config/knobs.py) inherits. What weighs several knobs or hosts together is in
sparkrig/config/rules.py."""

from __future__ import annotations

import ipaddress
import re
from pathlib import PurePosixPath
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from sparkrig import topology
from sparkrig.stacks import DEFAULT_STACK, STACKS, get

COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")
DIGEST_REF_RE = re.compile(r"^[a-z0-9][a-z0-9._:/-]*@sha256:[0-9a-f]{64}$")
NETDEV_RE = re.compile(r"^[A-Za-z0-9_.:-]{1,15}$")
REPO_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
SAFE_PATH_RE = re.compile(r"/[A-Za-z0-9._/-]*")  # an owned path knob (see _absolute)
# A browser origin as the Origin header carries it: scheme, host (name, IPv4, [IPv6]), port
ORIGIN_RE = re.compile(r"https?://([A-Za-z0-9.-]+|\[[0-9A-Fa-f:.]+\])(:[0-9]{1,5})?")
# a name a certificate may carry: a DNS name (no wildcard) or an IPv4/IPv6 address
DNS_LABEL = r"[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?"
DNS_OR_IP = re.compile(rf"{DNS_LABEL}(\.{DNS_LABEL})*|[0-9A-Fa-f.]*:[0-9A-Fa-f:.]*")
# Base images known not to serve GLM-5.3-Flash on GB10, by repository: reason (docs/sources.md).
# A digest cannot be traced back to its tag, so every digest of the stock repository is refused.
KNOWN_BAD_IMAGES = {
    "vllm/vllm-openai": (
        "the stock vLLM image (e.g. vllm/vllm-openai:glm53-flash-arm64-cu130) loads the weights, "
        "then dies in warmup on GB10 ('concat_and_cache_mla ... pe_dim must be 64 for "
        "fp8_ds_mla', docs/sources.md); use the default v11 image or another patched one"
    ),
}

# The knobs a stack pins (its declaration's image, model and drafter): each defaults to None, "the
# selected stack's pin"; stack_pins[<stack>] overrides them per stack, with these keys.
PIN_KEYS = ("base_image", "model_repo", "model_revision", "drafter_repo", "drafter_revision")


class KnownBadBaseline(BaseModel):
    """One entry of the catalogue ``known_bad_baselines``: a rank matching every condition it
    names is refused with ``reason`` (sparkrig/baseline.py ``known_bad``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    reason: str = Field(min_length=1)
    source: str = Field(pattern=r"^https?://\S+$")  # the thread the fact was taken from
    kernel: str | None = None  # regex on the kernel release
    driver: str | None = None  # regex on the NVIDIA driver version
    driver_below: str | None = Field(default=None, pattern=r"^\d+(\.\d+)*$")
    nic_fw: str | None = None  # regex on the fabric NIC's firmware version
    base_image: str | None = None  # regex on the base_image reference
    kho_active: bool | None = None  # kexec handover on in the running kernel

    @field_validator("kernel", "driver", "nic_fw", "base_image")
    @classmethod
    def _regex(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                re.compile(value)
            except re.error as err:
                raise ValueError(f"not a regular expression: {value!r} ({err})") from None
        return value

    @model_validator(mode="after")
    def _names_a_condition(self) -> KnownBadBaseline:
        conditions = ("kernel", "driver", "driver_below", "nic_fw", "base_image", "kho_active")
        if all(getattr(self, c) is None for c in conditions):
            raise ValueError(f"names no condition (one of {', '.join(conditions)})")
        return self


def pin_problem(key: str, value: Any) -> str | None:
    """Why ``value`` is no valid pin for ``key`` (one of PIN_KEYS), or None."""
    if not isinstance(value, str):
        return f"must be a string, not {value!r}"
    if key == "base_image" and not DIGEST_REF_RE.match(value):
        return f"must be pinned by digest (repo@sha256:<64 hex>), not {value!r}"
    if key.endswith("_revision") and not COMMIT_RE.match(value):
        return f"must be a 40-hex commit sha, not {value!r} (pin the revision)"
    if key.endswith("_repo") and not REPO_RE.match(value):
        return f"must be a Hub repository (owner/name), not {value!r}"
    return None


def known_bad_image(ref: str) -> str | None:
    """Why a base image reference is known to fail (KNOWN_BAD_IMAGES), or None."""
    name = ref.split("@", 1)[0]
    for prefix in ("docker.io/", "registry-1.docker.io/", "index.docker.io/"):
        name = name.removeprefix(prefix)
    repo = name.rsplit(":", 1)[0] if ":" in name.rsplit("/", 1)[-1] else name
    return KNOWN_BAD_IMAGES.get(repo)


class KnobChecks(BaseModel):
    """The checks of single knobs' values, by knob name; ``Knobs`` declares the knobs themselves
    (check_fields=False: the names are fields of that subclass, not of this one)."""

    @model_validator(mode="before")
    @classmethod
    def _stack_profile(cls, data: Any) -> Any:
        """``profile = None`` serves the selected stack's own profile (vllm-nvfp4: shared; a
        recipe that serves one configuration: that one), so `--data stack=<name>` alone switches."""
        if isinstance(data, dict) and data.get("profile") is None and "stack" in data:
            try:
                own = get(data["stack"]).own_profile
            except (ValueError, TypeError):  # an unknown stack: its own error names the choices,
                own = get(DEFAULT_STACK).own_profile  # and an unset profile is no second one
            data = {**data, "profile": own}
        return data

    @field_validator("model_revision", "drafter_revision", check_fields=False)
    @classmethod
    def _pinned_commit(cls, value: str | None) -> str | None:
        if value is not None and (why := pin_problem("model_revision", value)):
            raise ValueError(why)
        return value

    @field_validator("base_image", check_fields=False)
    @classmethod
    def _pinned_digest(cls, value: str | None) -> str | None:
        if value is not None and (why := pin_problem("base_image", value)):
            raise ValueError(why)
        return value

    @field_validator("stack", check_fields=False)
    @classmethod
    def _declared_stack(cls, value: str) -> str:
        return get(value).name  # ValueError naming the declared stacks

    @field_validator("stack_pins", check_fields=False)
    @classmethod
    def _stack_pins(cls, value: dict[str, dict[str, str]]) -> dict[str, dict[str, str]]:
        problems = []
        for stack, pins in value.items():
            if stack not in STACKS:
                problems.append(f"[{stack!r}]: unknown stack; choose among {', '.join(STACKS)}")
                continue
            for key, pin in pins.items():
                if key not in PIN_KEYS:
                    problems.append(
                        f"[{stack!r}][{key!r}]: unknown pin; the keys are {', '.join(PIN_KEYS)}"
                    )
                elif why := pin_problem(key, pin):
                    problems.append(f"[{stack!r}][{key!r}]: {why}")
        if problems:
            raise ValueError("; ".join(problems))
        return value

    @field_validator(
        "install_dir",
        "config_dir",
        "weights_dir",
        "cache_dir",
        "fabric_netplan_file",
        check_fields=False,
    )
    @classmethod
    def _absolute(cls, value: str) -> str:
        if not PurePosixPath(value).is_absolute():
            raise ValueError(f"must be an absolute path, not {value!r}")
        # these paths reach unit files, shell commands and the watchdog's probe unquoted in
        # places: letters, digits and . _ - / only (no `$(`, quote, space or newline)
        if not SAFE_PATH_RE.fullmatch(value) or "/../" in f"{value}/":
            raise ValueError(
                f"{value!r}: only letters, digits and . _ - / (no spaces, quotes, `$`, `..` or "
                "newlines: the path lands in unit files and shell commands)"
            )
        return value

    @field_validator("fabric_cidr", check_fields=False)
    @classmethod
    def _fabric_cidr(cls, value: str) -> str:
        try:
            net = ipaddress.IPv4Network(value, strict=True)
        except ValueError as err:
            raise ValueError(f"not an IPv4 network: {value!r} ({err})") from None
        if net.prefixlen > topology.LINK_PREFIX:
            raise ValueError(
                f"{value} is smaller than one /{topology.LINK_PREFIX} (each function class of "
                "each cable gets a /24 of it)"
            )
        return str(net)

    @field_validator("container_gpu_args", check_fields=False)
    @classmethod
    def _one_token_each(cls, value: list[str]) -> list[str]:
        for token in value:
            if not token or any(c.isspace() for c in token):
                raise ValueError(f"one argument per element (docker splits nothing), got {token!r}")
        return value

    @field_validator("extra_serve_args", check_fields=False)
    @classmethod
    def _non_empty(cls, value: list[str]) -> list[str]:
        if any(not token for token in value):
            raise ValueError("empty argument")
        for token in value:  # a newline would split the rank unit's ExecStart into two lines
            if any(not c.isprintable() for c in token):
                raise ValueError(
                    f"{token!r}: a control character (newline, tab, ...) in an argument"
                )
        return value

    @field_validator("api_cors_origins", check_fields=False)
    @classmethod
    def _origins(cls, value: list[str]) -> list[str]:
        for origin in value:
            if not ORIGIN_RE.fullmatch(origin):
                raise ValueError(
                    f"{origin!r} is not an origin: scheme://host[:port], no path, no wildcard "
                    "(the front compares the browser's Origin header with it exactly)"
                )
        return value

    @field_validator("api_tls_names", check_fields=False)
    @classmethod
    def _tls_names(cls, value: list[str]) -> list[str]:
        for name in value:
            if not DNS_OR_IP.fullmatch(name):
                raise ValueError(
                    f"{name!r} is neither a DNS name nor an IP address (letters, digits, '-' "
                    "and '.', or an IPv4/IPv6 address; no wildcard)"
                )
        return value

    @field_validator("api_allow", mode="before", check_fields=False)
    @classmethod
    def _comma_separated(cls, value: Any) -> Any:
        """``--data api_allow=10.1.0.0/16,fd00::/8`` arrives as one string: a comma list."""
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    @field_validator("api_allow", check_fields=False)
    @classmethod
    def _cidrs(cls, value: list[str]) -> list[str]:
        """Each entry a network (``10.0.0.0/8``, ``fd00::/8``, or one address); returned in
        canonical form. Host bits set (``10.1.2.3/8``) are refused: a typo, not a network."""
        out = []
        for entry in value:
            try:
                net = ipaddress.ip_network(str(entry), strict=True)
            except ValueError as err:
                raise ValueError(f"not a CIDR network: {entry!r} ({err})") from None
            out.append(str(net))
        return out

    @field_validator("nccl_env", check_fields=False)
    @classmethod
    def _env_names(cls, value: dict[str, str]) -> dict[str, str]:
        for key, val in value.items():
            if not re.match(r"^[A-Z_][A-Z0-9_]*$", key) or "\n" in str(val):
                raise ValueError(f"bad environment entry {key!r}={val!r}")
        return value
