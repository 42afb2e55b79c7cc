"""Several processes with one tied matrix: FSDP2 sharding that keeps every holder of the tied parameters in one group
(``fully_shard_tied``), and the check that a tie is still intact (``untied_pairs``), on the plain, FSDP2-sharded and
DeepSpeed-partitioned model alike (docs/multi_gpu.md). The tie itself is declared by the model
(hf_tiednorm/modeling/families/tie_topology.py).
"""

from __future__ import annotations

from torch import nn

from ..modeling.families.tie_topology import embedding_tie


def tied_holders(model: nn.Module) -> list[nn.Module]:
    """The distinct modules of an LM holding its tied parameters (owner, head); empty when untied."""
    tie = embedding_tie(model.config)
    return [] if tie is None else [model.get_submodule(path) for path in tie.holders()]


def untied_pairs(model: nn.Module) -> list[tuple[str, str]]:
    """(target, source) entries of the LM's tie whose parameters are not one object: empty when the tie is intact.

    Works on the plain, FSDP2-sharded (DTensor parameters) and DeepSpeed-partitioned model alike."""
    tie = embedding_tie(model.config)
    if tie is None:
        return []
    return [
        (target, source)
        for target, source in tie.tied_weights_keys().items()
        if model.get_parameter(target) is not model.get_parameter(source)
    ]


def fully_shard_tied(model: nn.Module, **fsdp_kwargs) -> nn.Module:
    """FSDP2 (``torch.distributed.fsdp.fully_shard``) for an hf_tiednorm LM: one group per transformer layer
    (``_no_split_modules``), one group for every holder of the tied parameters, the rest in the root group.

    ``fsdp_kwargs`` go to every ``fully_shard`` call (``mesh``, ``reshard_after_forward``, ...). The holders form
    one group whatever the topology or adaptive embedding, which accelerate's wrapping cannot do for the "decoder"
    topology or adaptive embeddings (it groups only the input and output embedding modules, and only when they
    share a ``weight``)."""
    from torch.distributed.fsdp import fully_shard

    layer_classes = set(model._no_split_modules or ())
    for module in model.modules():
        if type(module).__name__ in layer_classes:
            fully_shard(module, **fsdp_kwargs)
    holders = tied_holders(model)
    if holders:
        # Gathered from the first lookup to the head, and kept so after the forward: the weight-norm penalty reads
        # the head's weight after the head ran (accelerate keeps this group gathered for the same reason).
        fully_shard(holders, **{**fsdp_kwargs, "reshard_after_forward": False})
    return fully_shard(model, **fsdp_kwargs)


__all__ = ["fully_shard_tied", "tied_holders", "untied_pairs"]
