"""Where a scenario's trials run: the ``executor:`` key (this process, or actors on a Ray cluster) and the
``placement:`` key (the machine kinds of a Ray cluster a run measures, each named by a label).

A placement kind is Ray's accelerator type of a node (``accelerator_type: H100``, scheduled on the
``accelerator_type:H100`` resource Ray gives such nodes) or custom resources a node was started with
(``ray start --resources '{"pcie5": 1}'``). With two or more kinds every trial runs once per kind and its id gains
``@<label>``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Literal

from pydantic import AfterValidator, Field, field_validator, model_validator

from kvbench.errors import BadParameter, ScenarioError
from kvbench.offload.modes import whole_number
from kvbench.scenario.bounds import Strict, optional

#: Longest wait for a Ray worker to start and load its model (seconds): one day.
MAX_STARTUP_S = 86_400.0
#: Most Ray CPUs one CPU worker may ask for, and most workers per machine kind.
MAX_CPUS_PER_WORKER, MAX_WORKERS = 1024.0, 10_000
#: Characters of a placement label (it ends every trial id of a run across kinds), and of a Ray name.
MAX_LABEL, MAX_RAY_NAME = 32, 100
#: Characters of a cluster address.
MAX_ADDRESS = 300
#: Ray counts resources in steps of this much (``ray._private.ray_constants.MIN_RESOURCE_GRANULARITY``).
RESOURCE_STEP = 0.0001
#: What an actor asks of the ``accelerator_type:<X>`` resource: Ray's own convention for an accelerator type (a
#: node of that type holds 1 of it, so any number of actors fit).
ACCELERATOR_SHARE = 0.001
#: Ray resources an actor asks for through its own options (``num_cpus``, ``num_gpus``), never as custom ones.
RESERVED_RESOURCES = ("CPU", "GPU")

_LABEL = re.compile(rf"[A-Za-z0-9_][A-Za-z0-9_.-]{{0,{MAX_LABEL - 1}}}")
_RAY_NAME = re.compile(rf"[A-Za-z0-9_][A-Za-z0-9_.:/-]{{0,{MAX_RAY_NAME - 1}}}")
_HOST = re.compile(r"[A-Za-z0-9_]([A-Za-z0-9_.-]{0,252})|\[[0-9A-Fa-f:.]{2,45}\]")


def check_address(v: str) -> str:
    """A Ray cluster address as a scenario gives it: ``auto`` or ``HOST:PORT`` (a host name, an IPv4 address or a
    bracketed IPv6 one, and a port from 1 to 65535).

    Raises:
        ValueError: over :data:`MAX_ADDRESS` characters, a scheme (``ray://``, ``http://``), no port, an empty
            host, a port out of range, or a host with characters no host name has.
    """
    if v == "auto":
        return v
    if len(v) > MAX_ADDRESS:
        raise ValueError(f"is {len(v):,} characters long; an address has at most {MAX_ADDRESS}")
    if "://" in v:
        raise ValueError(f"give HOST:PORT without a scheme ({v.split('://', 1)[0]}://): the address of the cluster's "
                         "head, as `ray start --head` prints it (port 6379 by default); Ray Client (ray://) is not "
                         "used")
    host, sep, port = v.rpartition(":")
    if not sep or not re.fullmatch(r"[0-9]+", port):
        raise ValueError("must be auto or HOST:PORT, e.g. 10.0.0.5:6379 (the address `ray start --head` prints)")
    if not host:
        raise ValueError("the host before ':' is empty: give HOST:PORT, e.g. 10.0.0.5:6379")
    if not 1 <= int(port) <= 65535:
        raise ValueError(f"port {int(port)} is not from 1 to 65535")
    if not _HOST.fullmatch(host):
        raise ValueError(f"{host!r} is not a host name or IP address (an IPv6 address goes in brackets: [::1]:6379)")
    return v


def check_label(v: str) -> str:
    """A placement label: 1 to :data:`MAX_LABEL` letters, digits, ``_``, ``.`` and ``-``, starting with a letter,
    digit or ``_`` (it ends trial ids: ``p32-b1-full-r0@h100``).

    Raises:
        ValueError: any other text.
    """
    if not _LABEL.fullmatch(v):
        raise ValueError(f"must be 1 to {MAX_LABEL} letters, digits, '_', '.' and '-', starting with a letter, digit "
                         "or '_' (it ends the trial ids of this kind)")
    return v


def _ray_name(v: str) -> str:
    if not _RAY_NAME.fullmatch(v):
        raise ValueError(f"must be 1 to {MAX_RAY_NAME} letters, digits, '_', '.', '-', ':' and '/', starting with a "
                         "letter, digit or '_' (as the cluster's nodes name it)")
    return v


RayName = Annotated[str, AfterValidator(_ray_name)]
Amount = Annotated[float, Field(strict=True, gt=0, le=1e9, allow_inf_nan=False)]


class ExecutorSpec(Strict):
    """Where the trials run: in this process (``local``, the default) or in Ray actors (``ray``), one per GPU (or
    per ``cpus_per_worker`` CPUs on a CPU node), each loading the model once for its group of trials."""

    kind: Literal["local", "ray"] = Field("local", description="local (this process) | ray (actors on a Ray "
                                          "cluster; needs the extra kvbench[ray]).")
    address: Annotated[str, AfterValidator(check_address)] | None = optional(
        "ray: the cluster to join: auto (the cluster `ray start` made on this machine, or RAY_ADDRESS) or HOST:PORT "
        "of its head (default: start a Ray instance on this machine for the run).")
    cpus_per_worker: Annotated[float, Field(strict=True, gt=0, le=MAX_CPUS_PER_WORKER, allow_inf_nan=False)] = Field(
        1.0, description="ray: Ray CPUs each CPU worker holds (a GPU worker holds one GPU).")
    workers: whole_number(1, MAX_WORKERS) | None = optional(
        "ray: at most this many workers per machine kind (default: as many as the cluster's resources allow).")
    startup_timeout_s: Annotated[float, Field(strict=True, gt=0, le=MAX_STARTUP_S, allow_inf_nan=False)] = Field(
        600.0, description="ray: longest wait for a worker to start and load its model (seconds).")

    @model_validator(mode="after")
    def _ray_keys(self) -> ExecutorSpec:
        if self.kind == "local":  # by value: a scenario's dump (run.json) holds every key with its default
            defaults = {"address": None, "workers": None, "cpus_per_worker": 1.0, "startup_timeout_s": 600.0}
            given = [k for k, v in defaults.items() if getattr(self, k) != v]
            if given:
                raise ValueError(f"{given[0]}: applies to kind ray (this executor is local): remove it, or set "
                                 "kind: ray")
        return self


def override_executor(spec: ExecutorSpec, kind: str | None = None, address: str | None = None) -> ExecutorSpec:
    """``spec`` (a scenario's executor) as a run asks for it: ``kind`` replaces its kind (``local`` drops its Ray
    settings), ``address`` its address and implies ``ray``; both None gives ``spec`` itself.

    Raises:
        BadParameter: ``kind`` is neither local nor ray, ``address`` is not ``auto`` or ``HOST:PORT`` (see
            :func:`check_address`), or ``address`` is given with ``kind`` local.
    """
    if kind is not None and kind not in ("local", "ray"):
        raise BadParameter(f"{{executor}} {kind!r}: must be local or ray", "executor")
    if address is not None:
        if kind == "local":
            raise BadParameter("{address} applies to the ray executor; {executor} is local", "address", "executor")
        try:
            check_address(address)
        except ValueError as exc:
            raise BadParameter(f"{{address}} {address!r}: {exc}", "address") from None
        kind = "ray"
    if kind is None:
        return spec
    if kind == "local":
        return ExecutorSpec()
    given = {k: getattr(spec, k) for k in spec.model_fields_set if k != "kind"} if spec.kind == "ray" else {}
    return ExecutorSpec(**{**given, "kind": "ray", **({"address": address} if address is not None else {})})


#: Why a scenario's ``placement:`` cannot run under the local executor (``kvbench run`` and ``kvbench validate``).
LOCAL_PLACEMENT = "needs the ray executor (executor.kind: ray): a local run measures this machine only"


def check_placement(executor: ExecutorSpec, placement: list[PlacementSpec] | None, where: str | Path) -> None:
    """Refuse a ``placement`` the ``executor`` (a scenario's, or as a run overrides it: :func:`override_executor`)
    cannot run, naming the scenario file ``where``, as ``kvbench run`` and ``kvbench validate`` refuse it.

    Raises:
        ScenarioError: placement kinds under the local executor (``placement``: :data:`LOCAL_PLACEMENT`).
    """
    if executor.kind == "local" and placement:
        raise ScenarioError(where, [("placement", LOCAL_PLACEMENT)])


class PlacementSpec(Strict):
    """One machine kind of a Ray cluster: Ray's accelerator type of its nodes, or custom resources they hold."""

    name: Annotated[str, AfterValidator(check_label)] | None = optional(
        f"The kind's label in trial ids and reports: 1 to {MAX_LABEL} letters, digits, '_', '.', '-' (default: "
        "accelerator_type, or the one resource's name).")
    accelerator_type: RayName | None = optional(
        "Ray's accelerator type of the nodes, e.g. H100, L4, A100 (Ray schedules on accelerator_type:<X>).")
    resources: dict[RayName, Amount] | None = optional(
        "Custom Ray resources a node must hold (name: amount per worker), as given to `ray start --resources`.")

    @field_validator("resources")
    @classmethod
    def _resources(cls, v: dict[str, float] | None) -> dict[str, float] | None:
        if v is None:
            return v
        if not v:
            raise ValueError("is empty: name at least one resource (or give accelerator_type)")
        for name, amount in v.items():
            if name in RESERVED_RESOURCES:
                raise ValueError(f"{name}: kvbench asks for CPUs and GPUs itself (one GPU, or executor."
                                 "cpus_per_worker CPUs, per worker): name a custom resource")
            if amount < RESOURCE_STEP:
                raise ValueError(f"{name}: {amount:g} is less than {RESOURCE_STEP:g}, the step in which Ray counts "
                                 "resources")
        return v

    @model_validator(mode="after")
    def _one_kind(self) -> PlacementSpec:
        given = [k for k in ("accelerator_type", "resources") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(f"give exactly one of accelerator_type, resources (got {' and '.join(given) or 'none'})")
        if self.name is None:
            if self.resources is not None and len(self.resources) > 1:
                raise ValueError(f"give a name: the kind asks for {len(self.resources)} resources, so none of them "
                                 "labels it")
            try:
                check_label(self.label)
            except ValueError as exc:
                raise ValueError(f"give a name: {self.label!r} cannot label the kind: it {exc}") from None
        return self

    @property
    def label(self) -> str:
        """The kind's label: ``name``, else ``accelerator_type``, else the single resource's name."""
        if self.name is not None:
            return self.name
        if self.accelerator_type is not None:
            return self.accelerator_type
        return next(iter(self.resources or {}))

    def ray_resources(self) -> dict[str, float]:
        """What a worker of this kind asks Ray for besides CPUs and GPUs (resource name → amount):
        ``{"accelerator_type:<X>": 0.001}`` for an accelerator type (Ray's convention), else ``resources``."""
        if self.accelerator_type is not None:
            return {f"accelerator_type:{self.accelerator_type}": ACCELERATOR_SHARE}
        return dict(self.resources or {})
