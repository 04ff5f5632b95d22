"""Code a scaffolded plugin carries when its plans need more than a plan dict: an attention processor that routes the
model's own processor's kernel call through cache-dit's `_dispatch_attention_fn` (with the CP config, and a joint
key mask put in the order Ulysses' all-to-all gives the keys), and a wrapper that runs a sequence-dependent router, or
a block that folds its tokens into the image grid, on the whole sequence under CP, and one that counts per rank an integer the blocks take for the tokens at one end
of their sequence. `HELPERS` is pasted into the plugin as it is; `write` decides whether it is used.
"""

HELPERS = '''
# -- helpers written by `ditgate scaffold` (used by the plans below) ----------------------------------------------
def _cp_config_of(transformer):
    """The CP config cache-dit set on the transformer's attention processors (None without CP)."""
    for module in transformer.modules():
        processor = getattr(module, "processor", None)
        config = getattr(processor, "_cp_config", None) or getattr(processor, "_parallel_config", None)
        if config is not None:
            return config
    return None


def _key_mask_in_gathered_order(mask, image_local, key_local, world, text_first):
    """A key mask over [image, text] (or [text, image]) of the whole sequence, reordered as Ulysses' all-to-all
    gathers the keys: each rank's own image share then its own text share, rank by rank."""
    text_local = key_local - image_local
    order = []
    for r in range(world):
        if text_first:  # the whole mask is [text, image]; each rank's keys are [its text, its image]
            first = list(range(r * text_local, (r + 1) * text_local))
            second = [text_local * world + i for i in range(r * image_local, (r + 1) * image_local)]
        else:  # [image, text]; each rank's keys are [its image, its text]
            first = list(range(r * image_local, (r + 1) * image_local))
            second = [image_local * world + i for i in range(r * text_local, (r + 1) * text_local)]
        order += first + second
    index = torch.tensor(order, device=mask.device)
    mask = mask.index_select(-1, index)
    if mask.shape[-2] == len(order):  # a mask over queries too (Chroma's [B, 1, S, S]): its rows in the same order
        mask = mask.index_select(-2, index)
    return mask


class RoutedAttention:
    """The model's own attention processor, its kernel call routed through cache-dit's `_dispatch_attention_fn` with
    the CP config cache-dit sets on this processor, and a key mask over the joint sequence reordered for Ulysses;
    `local`: without the CP config (cross-attention whose keys stay whole on every rank)."""

    _attention_backend = None
    _cp_config = None
    _parallel_config = None
    text_local = None  # this rank's text tokens, seen by the last block that took the text as its own stream

    def __init__(self, inner, reorder_mask=True, text_first=False, local=False, gather_keys=False):
        self.inner, self.reorder_mask, self.text_first, self.local = inner, reorder_mask, text_first, local
        self.gather_keys = gather_keys  # keys [this rank's image share, the whole text]: gather the image part
        self.namespace = vars(sys.modules[type(inner).__module__])

        def call(attn, *args, **kwargs):
            return type(self).__call__(self, attn, *args, **kwargs)

        # diffusers' Attention passes on only the keyword arguments its processor's signature names (RoPE, masks)
        call.__signature__ = inspect.signature(inner.__call__)
        self.__call__ = call

    def __call__(self, attn, *args, **kwargs):
        hidden = kwargs.get("hidden_states", args[0] if args else None)
        text = kwargs.get("encoder_hidden_states", args[1] if len(args) > 1 else None)
        if torch.is_tensor(text) and torch.is_tensor(hidden) and text.ndim == hidden.ndim == 3:
            RoutedAttention.text_local = text.shape[1]  # a later block over the concatenated stream reuses it
        cp = None if self.local else (self._cp_config or self._parallel_config)  # local: keys whole on every rank

        def kernel(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False,
                   **ignored):
            if cp is not None and self.gather_keys and attn_mask is None:  # every rank's image keys, its own text
                group, image_local = cp._flattened_mesh.get_group(), hidden.shape[1]

                def whole(x):
                    parts = [torch.empty_like(x[:, :image_local]) for _ in range(dist.get_world_size(group))]
                    dist.all_gather(parts, x[:, :image_local].contiguous(), group=group)
                    return torch.cat([*parts, x[:, image_local:]], dim=1)

                return _dispatch_attention_fn(query, whole(key), whole(value), dropout_p=dropout_p,
                                              is_causal=is_causal, scale=scale, enable_gqa=enable_gqa, cp_config=None)
            if attn_mask is not None and attn_mask.ndim == 2:
                attn_mask = attn_mask[:, None, None, :]
            if cp is not None and attn_mask is not None and attn_mask.ndim == 4 and attn_mask.shape[-1] == key.shape[1] \
                    and attn_mask.shape[-2] in (1, key.shape[1]) and cp.ulysses_degree > 1:
                # a mask over this rank's own keys (its text mask split with the text): every rank's key mask,
                # gathered in Ulysses' order ([image_0, text_0, image_1, text_1]), for the keys and the queries
                group = cp._flattened_mesh.get_group()
                keys = attn_mask.any(dim=-2, keepdim=True).contiguous()
                parts = [torch.empty_like(keys) for _ in range(dist.get_world_size(group))]
                dist.all_gather(parts, keys, group=group)
                keys = torch.cat(parts, dim=-1)
                attn_mask = keys & keys.transpose(-1, -2) if attn_mask.shape[-2] > 1 else keys
            elif cp is not None and attn_mask is not None and self.reorder_mask and cp.ulysses_degree > 1:
                image_local = hidden.shape[1]
                if image_local == key.shape[1] and RoutedAttention.text_local:  # one stream of [text, image] shares
                    image_local -= RoutedAttention.text_local
                attn_mask = _key_mask_in_gathered_order(attn_mask, image_local, key.shape[1], cp.ulysses_degree,
                                                        self.text_first)
            one_stream = attn_mask is None and key.shape[1] == query.shape[1]
            if cp is not None and is_causal and one_stream and cp.ulysses_degree > 1 and cp.ring_degree == 1:
                # one stream split in order: after Ulysses' all-to-all every rank holds all its tokens in sequence
                # order (a share of the heads), so a causal mask over the gathered length is exact (cache-dit's CP
                # refuses is_causal)
                whole = key.shape[1] * cp.ulysses_degree
                attn_mask = torch.ones(whole, whole, dtype=torch.bool, device=query.device).tril()[None, None]
                is_causal = False
            gqa = {"cp_gqa_strategy": "replicate_kv_sequence"} if cp is not None and enable_gqa else {}
            extra = key.shape[1] - query.shape[1]
            if cp is not None and extra > 0:  # cache-dit's Ulysses moves q, k and v with the query's shape: pad the
                pad = query.new_zeros(query.shape[0], extra, *query.shape[2:])  # queries where the text keys sit
                query = torch.cat([pad, query] if self.text_first else [query, pad], dim=1)
            out = _dispatch_attention_fn(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p,
                                         is_causal=is_causal, scale=scale, enable_gqa=enable_gqa, cp_config=cp,
                                         **gqa)  # GQA under Ulysses: each rank's q heads meet their kv heads
            if cp is not None and extra > 0:  # the padded queries' outputs are dropped
                out = out[:, extra:] if self.text_first else out[:, :out.shape[1] - extra]
            return out

        if "dispatch_attention_fn" in self.namespace:  # diffusers' layout [B, S, H, D]
            owner, name, routed = self.namespace, "dispatch_attention_fn", kernel
        else:  # a processor that calls SDPA itself: layout [B, H, S, D]; the original is back while cache-dit runs
            owner, name = vars(torch.nn.functional), "scaled_dot_product_attention"

            def routed(query, key, value, *rest, **options):
                owner[name] = original
                try:
                    return kernel(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2), *rest,
                                  **options).transpose(1, 2)
                finally:
                    owner[name] = routed
        original = owner[name]
        owner[name] = routed
        try:
            return self.inner(attn, *args, **kwargs)
        finally:
            owner[name] = original


class PadText:
    """Under CP, a joint text of `length` tokens the ranks do not divide gets masked zero tokens up to a length they
    do, before cache-dit splits it: the text at the first block, the text mask at every block. A masked key weighs
    nothing and the padded queries' outputs are never read (the text is dropped after the blocks)."""

    def __init__(self, transformer, names, length):
        self.transformer, self.names, self.length = transformer, names, length

    def __call__(self, module, args, kwargs):
        cp = _cp_config_of(self.transformer)
        if cp is None:
            return None
        extra = -self.length % dist.get_world_size(cp._flattened_mesh.get_group())
        params = list(inspect.signature(type(module).forward).parameters)[1:]
        args = list(args)
        for name in self.names:
            i = params.index(name) if name in params else len(args)
            value = kwargs.get(name, args[i] if i < len(args) else None)
            if not (extra and torch.is_tensor(value) and value.ndim >= 2 and value.shape[1] == self.length):
                continue
            value = torch.cat([value, value.new_zeros(value.shape[0], extra, *value.shape[2:])], dim=1)
            if i < len(args) and name not in kwargs:
                args[i] = value
            else:
                kwargs[name] = value
        return tuple(args), kwargs


class SplitListInputs:
    """Under CP, a transformer input given as a list of sequence-long tensors (cache-dit's root split takes tensors
    only): each element cut to this rank's share on its dimension (`names`: input -> dim), as the root split cuts
    the tensors they meet."""

    def __init__(self, names):
        self.names = names

    def __call__(self, module, args, kwargs):
        cp = _cp_config_of(module)
        if cp is None:
            return None
        group = cp._flattened_mesh.get_group()
        world, rank = dist.get_world_size(group), dist.get_rank(group)
        params, args = list(inspect.signature(type(module).forward).parameters)[1:], list(args)
        for name, dim in self.names.items():
            i = params.index(name) if name in params else len(args)
            value = kwargs.get(name, args[i] if i < len(args) else None)
            if not isinstance(value, (list, tuple)):
                continue
            value = type(value)(x.chunk(world, dim=dim)[rank] if torch.is_tensor(x) else x for x in value)
            if i < len(args) and name not in kwargs:
                args[i] = value
            else:
                kwargs[name] = value
        return tuple(args), kwargs


def split_list_inputs(transformer, names):
    if not getattr(transformer, "_split_list_inputs", False):
        transformer.register_forward_pre_hook(SplitListInputs(names), with_kwargs=True)
        transformer._split_list_inputs = True


def pad_text(transformer, blocks, names, length):
    for block in blocks:
        block.register_forward_pre_hook(PadText(transformer, names, length), with_kwargs=True)


def route_attention(modules, reorder_mask=True, text_first=False, local=False, gather_keys=False):
    for attn in modules:
        if not isinstance(attn.processor, RoutedAttention):
            routed = RoutedAttention(attn.processor, reorder_mask, text_first, local, gather_keys)
            if hasattr(attn, "set_processor"):
                attn.set_processor(routed)
            else:  # an attention class of its own without the setter (Mochi's)
                attn.processor = routed


class HeadTables:
    """The model's attention processor under TP, the tables it receives with one row per head ([..., heads, dim]:
    RoPE frequencies learned per head) cut to this rank's heads, as its sharded q/k/v are."""

    def __init__(self, inner, heads, rank, world, names):
        self.inner, self.heads, self.rank, self.world, self.names = inner, heads, rank, world, names

        def call(attn, *args, **kwargs):
            return type(self).__call__(self, attn, *args, **kwargs)

        call.__signature__ = inspect.signature(inner.__call__)
        self.__call__ = call

    def __call__(self, attn, *args, **kwargs):
        share = self.heads // self.world

        def cut(x):
            if torch.is_tensor(x) and x.ndim >= 3 and x.shape[-2] == self.heads:
                return x.narrow(-2, self.rank * share, share)
            return type(x)(cut(v) for v in x) if isinstance(x, (tuple, list)) else x

        kwargs = {k: cut(v) if k in self.names else v for k, v in kwargs.items()}
        return self.inner(attn, *args, **kwargs)


def cut_head_tables(attn, heads, tp_mesh, names):
    processor = HeadTables(attn.processor, heads, tp_mesh.get_local_rank(), tp_mesh.size(), names)
    if hasattr(attn, "set_processor"):
        attn.set_processor(processor)
    else:
        attn.processor = processor


def blocks_like(blocks, sublayers):
    """The blocks whose sub-layers named in `sublayers` are of those classes (None: absent)."""
    def kind(block, name):
        child = dict(block.named_children()).get(name)
        return None if child is None else type(child).__name__

    return [b for b in blocks if all(kind(b, n) == c for n, c in sublayers.items())]


class SplitDictOutput:
    """A module whose output is a dict of per-token tables, each entry cut to this rank's share of the sequence
    under CP (the contiguous chunk Ulysses gives this rank), as a CP plan entry would cut a tensor output."""

    def __init__(self, transformer, module, dims):
        self.transformer, self.forward, self.dims = transformer, module.forward, dims

    def __call__(self, *args, **kwargs):
        out = self.forward(*args, **kwargs)
        cp = _cp_config_of(self.transformer)
        if cp is None:
            return out
        group = cp._flattened_mesh.get_group()
        world, rank = dist.get_world_size(group), dist.get_rank(group)
        return {k: v.chunk(world, dim=self.dims[k])[rank] if k in self.dims else v for k, v in out.items()}


def split_dict_output(transformer, module, dims):
    if not isinstance(module.forward, SplitDictOutput):
        module.forward = SplitDictOutput(transformer, module, dims)


class CutJointTable:
    """Under CP, a per-token table over the image then the text tokens that a block receives whole (`name`, the
    sequence on `dim`), cut to this rank's image rows joined to its text rows, the order of its own stream: the whole
    image's rows are this rank's image tokens times the ranks, read at a block that takes the image (`hidden`) and
    the text (`text`) apart after the split; text rows as many as this rank's text were made from its own text and
    stay. A block over the joined stream (`text` None) gets the cut made for the same table."""

    last = (None, None)  # the last whole table cut, and its cut

    def __init__(self, transformer, block, name, dim, hidden, text):
        self.transformer, self.forward, self.name, self.dim = transformer, block.forward, name, dim
        self.hidden, self.text = hidden, text
        self.signature = inspect.signature(type(block).forward.__get__(block))

    def __call__(self, *args, **kwargs):
        cp = _cp_config_of(self.transformer)
        bound = self.signature.bind(*args, **kwargs)
        table, given = bound.arguments.get(self.name), bound.arguments
        if cp is None or not torch.is_tensor(table):
            return self.forward(*args, **kwargs)
        if CutJointTable.last[0] is not table:
            if not (torch.is_tensor(given.get(self.hidden)) and torch.is_tensor(given.get(self.text))):
                return self.forward(*args, **kwargs)
            group = cp._flattened_mesh.get_group()
            world, rank = dist.get_world_size(group), dist.get_rank(group)
            image, text_local = given[self.hidden].shape[1] * world, given[self.text].shape[1]
            text = table.narrow(self.dim, image, table.shape[self.dim] - image)
            text = text if text.shape[self.dim] == text_local else text.chunk(world, self.dim)[rank]
            CutJointTable.last = (table, torch.cat([table.narrow(self.dim, 0, image).chunk(world, self.dim)[rank],
                                                    text], self.dim))
        params, args = list(self.signature.parameters), list(args)  # the call's own form, the table replaced
        if self.name in kwargs or params.index(self.name) >= len(args):
            kwargs[self.name] = CutJointTable.last[1]
        else:
            args[params.index(self.name)] = CutJointTable.last[1]
        return self.forward(*args, **kwargs)


def cut_joint_table(transformer, blocks, name, dim, hidden, text):
    for block in blocks:
        if not isinstance(block.forward, CutJointTable):
            block.forward = CutJointTable(transformer, block, name, dim, hidden, text)


class PartCount:
    """Under CP, an integer a block receives that counts the tokens at one end of its sequence (`end`: "head" or
    "tail") becomes the count of those tokens in this rank's contiguous share of the split sequence (its first
    positional input, split before this runs), as the per-token tables split with it."""

    def __init__(self, transformer, block, name, end):
        self.transformer, self.forward, self.name, self.end = transformer, block.forward, name, end
        self.signature = inspect.signature(type(block).forward.__get__(block))

    def __call__(self, *args, **kwargs):
        cp = _cp_config_of(self.transformer)
        bound = self.signature.bind(*args, **kwargs)
        count = bound.arguments.get(self.name)
        if cp is None or not isinstance(count, int):
            return self.forward(*args, **kwargs)
        group = cp._flattened_mesh.get_group()
        local = next(iter(bound.arguments.values())).shape[1]
        start, total = dist.get_rank(group) * local, local * dist.get_world_size(group)
        first, last = (total - count, total) if self.end == "tail" else (0, count)
        bound.arguments[self.name] = max(0, min(last, start + local) - max(first, start))
        return self.forward(*bound.args, **bound.kwargs)


def count_parts(transformer, blocks, name, end):
    for block in blocks:
        if not isinstance(block.forward, PartCount):
            block.forward = PartCount(transformer, block, name, end)


class GatheredRouting:
    """Runs a module whose output depends on the whole sequence (an expert-choice router; a block that folds its
    tokens into the image grid) on the whole sequence under CP: its sequence-long inputs (dim 1; `names`: those
    arguments alone) are gathered from the ranks, its output is cut back to this rank's share."""

    def __init__(self, transformer, module, names=None):
        self.transformer, self.forward, self.names = transformer, module.forward, names
        self.signature = inspect.signature(type(module).forward.__get__(module)) if names else None

    def __call__(self, *args, **kwargs):
        cp = _cp_config_of(self.transformer)
        if cp is None:
            return self.forward(*args, **kwargs)
        group = cp._flattened_mesh.get_group()
        world, rank = dist.get_world_size(group), dist.get_rank(group)
        bound = self.signature.bind(*args, **kwargs) if self.names else None
        local = (bound.arguments[self.names[0]] if bound else next(
            a for a in (*args, *kwargs.values()) if torch.is_tensor(a) and a.ndim >= 3)).shape[1]

        def whole(x):
            if not (torch.is_tensor(x) and x.ndim >= 3 and x.shape[1] == local):
                return x
            parts = [torch.empty_like(x) for _ in range(world)]
            dist.all_gather(parts, x.contiguous(), group=group)
            return torch.cat(parts, dim=1)

        if bound:  # the named arguments alone (a text as long as this rank's share stays as it is)
            bound.arguments.update({n: whole(bound.arguments[n]) for n in self.names if n in bound.arguments})
            out = self.forward(*bound.args, **bound.kwargs)
        else:
            out = self.forward(*[whole(a) for a in args], **{k: whole(v) for k, v in kwargs.items()})
        return out[:, rank * local:(rank + 1) * local]


def gather_routing(transformer, modules):
    for module in modules:
        if not isinstance(module.forward, GatheredRouting):
            module.forward = GatheredRouting(transformer, module)


def gather_grid(transformer, blocks, names):
    for block in blocks:
        if not isinstance(block.forward, GatheredRouting):
            block.forward = GatheredRouting(transformer, block, names)
'''
