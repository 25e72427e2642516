"""Every extension point of infer, in one file.

A plugin is a module (found through the ``infer.plugins`` entry-point group) that sets
``INFER_API_VERSION`` to the major version it was built for and implements any subset of the
hooks below with ``@hookimpl``. Hooks run once, at start-up: they hand the core objects (probes,
platform factories, backend classes) that the hot loop then calls directly. Each ``register_*``
hook receives a ``register`` callback; call it once per thing contributed. Hooks are called with
keyword arguments, and an implementation may accept any subset of them (pluggy's rule).

Where a ``register`` callback takes ``platforms`` (a name or a list of names), leaving it out
registers the contribution for every platform; a contribution registered for a platform by name
wins there over one registered for every platform. The core registers its plain-torch reference
ops that way (``infer.core.ops.reference``), so any platform can run them.

The factories of attention backends, linear methods, MoE runners, communicators and graph runners
(and a layer op's ``fn``) may be given as ``"module:attr"`` strings: they are imported only when
picked (``infer.core.plugins.load_target``), which keeps registration free of heavy imports.
"""

from __future__ import annotations

import pluggy

API_VERSION = 1
"""Major version of this hook API. A plugin that declares another major version is refused."""

hookspec = pluggy.HookspecMarker("infer")
hookimpl = pluggy.HookimplMarker("infer")


@hookspec
def register_platforms(register):  # noqa: ANN001, ANN201
    """Contribute device platforms.

    Called when the plugin manager loads. ``register(name, probe, factory)`` takes the platform
    name (``"cpu"``, ``"cuda"``, ...), a ``probe() -> ProbeResult`` that must be cheap and must not
    initialise a device context, and a ``factory(probe_result) -> Platform`` called only for the
    platform that is selected.
    """


@hookspec
def register_support_matrix(register):  # noqa: ANN001, ANN201
    """Contribute support-matrix entries.

    ``register(platform, entries)`` takes a platform name and an iterable of
    ``infer.core.support.Entry``. Called once when the matrix is first built; several plugins may
    contribute to one platform (a third-party attention backend adds its own ``flag=value`` rows).
    """


@hookspec
def register_attention_backends(register):  # noqa: ANN001, ANN201
    """Contribute attention backends.

    ``register(name, factory, platforms)`` takes the ``--attention-backend`` value, a
    ``factory(AttentionConfig) -> AttentionBackend`` and the platform names it runs on. Called at
    start-up; the model runner calls the chosen factory once per model.
    """


@hookspec
def register_linear_methods(register):  # noqa: ANN001, ANN201
    """Contribute GEMM / linear methods, keyed by quantization.

    ``register(quantization, factory, platforms)``: ``quantization`` is the ``--quantization``
    value (``None`` for the unquantized method), ``factory(LinearConfig) -> LinearMethod``.
    """


@hookspec
def register_moe_runners(register):  # noqa: ANN001, ANN201
    """Contribute MoE expert runners.

    ``register(name, factory, platforms)``: ``name`` is the ``--moe-runner-backend`` value
    (``"auto"`` picks the platform default), ``factory() -> MoERunner``. Besides ``apply`` a
    runner may override the optional ``select_experts`` routing hook (infer.core.ops.moe).
    """


@hookspec
def register_communicators(register):  # noqa: ANN001, ANN201
    """Contribute collective-communication implementations.

    ``register(name, factory, platforms)``: ``factory(world_size, rank, group=None) ->
    Communicator`` over the ``world_size`` ranks of a tensor-parallel group (``group``: a
    torch.distributed group, None for the default group that the multi-rank executor initialises
    with ``platform.dist_backend``). The name is the platform's ``dist_backend``.
    """


@hookspec
def register_graph_runners(register):  # noqa: ANN001, ANN201
    """Contribute decode graph-capture implementations (CUDA graphs, ACL graphs, HPU graphs).

    ``register(name, factory, platforms)``: ``factory(model_runner, graph_config) -> GraphRunner``,
    where ``graph_config`` is the ``infer.core.config.views.GraphConfig`` view of the settings
    (``disable``, ``batch_sizes``, ``max_bs``, ``disable_padding``, piecewise and torch.compile
    settings) and ``model_runner`` offers what ``infer.core.engine.model_runner`` documents.
    """


@hookspec
def register_layer_ops(register):  # noqa: ANN001, ANN201
    """Contribute fused per-layer ops (RMSNorm with residual add, rotary, SiLU gate).

    ``register(name, fn, platforms)``: ``name`` is one of ``infer.core.ops.layer_ops.OPS``, ``fn``
    has the reference's signature and may return ``None`` for inputs it does not handle (the
    reference then runs). Optional: a platform without contributions uses the torch references.
    """


@hookspec
def register_models(register):  # noqa: ANN001, ANN201
    """Contribute model architectures.

    ``register(architecture, model_class)``: ``architecture`` is the Hugging Face
    ``config.architectures[0]`` name (``"LlamaForCausalLM"``); ``model_class(config, ctx)``.
    Built-in models register through the core's own plugin in exactly the same way.
    """
