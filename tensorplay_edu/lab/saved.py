"""What autograd saves for backward, per layer (notebooks 04 and 04b measure SP's memory with it)."""

import torch
import torch.distributed as dist

__all__ = ["saved_bytes", "saved_per_layer"]


def saved_bytes(model, run, groups=None, outside="edges", storages=None) -> dict:
    """Bytes saved for backward while ``run()`` executes, then its loss's backward: ``{layer name or "edges":
    bytes}``. Each storage counts once (``wq``, ``wk``, ``wv`` save one input; a view saves its base);
    parameters and buffers are left out; a tensor belongs to the layer whose forward is running (the innermost),
    anything outside ``model.layers`` to "edges". ``groups``, a list of (label, module) pairs, replaces the
    layers (06 labels the norms "norms", the model "other"); ``outside`` renames "edges"; a dict passed as
    ``storages`` receives {storage pointer: bytes} of what was counted (05 asks whether the logits are among them)."""
    skip = {q.untyped_storage().data_ptr() for q in [*model.parameters(), *model.buffers()]}
    groups = list(model.layers.items()) if groups is None else groups
    stack, seen = [], {}                                     # the labels of the forwards running, innermost last
    hooks = [mod.register_forward_pre_hook(lambda m, a, n=label: stack.append(n)) for label, mod in groups]
    hooks += [mod.register_forward_hook(lambda m, a, o: stack.pop() and None) for _, mod in groups]

    def pack(tensor):
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in skip and storage.data_ptr() not in seen and storage.nbytes():
            seen[storage.data_ptr()] = (stack[-1] if stack else outside, storage.nbytes(), tensor)   # keep it: its storage stays unique
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        loss = run()
    for hk in hooks:
        hk.remove()
    loss.backward()
    out = {}
    for name, nbytes, _ in seen.values():
        out[name] = out.get(name, 0) + nbytes
    if storages is not None:
        storages.update({ptr: nbytes for ptr, (_, nbytes, _) in seen.items()})
    return out


def saved_per_layer(plan: str, configs, tokens, n_layers: int) -> list:
    """One rank's worker (or one process with ``plan="none"``): for each ``ModelArgs`` keyword dict in
    ``configs``, a seed-0 Llama of ``n_layers`` under ``parallelize_llama(plan)``, one loss on ``tokens``:
    its :func:`saved_bytes`."""
    from tensorplay_edu import init_device_mesh
    from tensorplay_edu.models import ModelArgs, Transformer, llama_loss, loss_context, parallelize_llama

    mesh = init_device_mesh("cpu", (dist.get_world_size(),)) if plan != "none" else None
    out = []
    for args in configs:
        torch.manual_seed(0)
        model = Transformer(ModelArgs(n_layers=n_layers, **args))
        if plan != "none":
            parallelize_llama(model, mesh, plan)
        with loss_context(plan if plan != "none" else "vanilla"):
            out.append(saved_bytes(model, lambda: llama_loss(model(tokens), tokens)))
    return out
