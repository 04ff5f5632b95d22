"""`ditgate inspect`: anatomy of real tiny pipelines (zoo models and a tiny GQA + mask DiT), CLI output and plan."""

import copy
import json

import pytest
import torch
import torch.nn.functional as F
from diffusers import DiffusionPipeline, FlowMatchEulerDiscreteScheduler, ModelMixin
from diffusers.configuration_utils import ConfigMixin, register_to_config
from torch import nn

import ditgate
from ditgate import zoo
from ditgate.core import request
from ditgate.inspect.anatomy import analyse, build_call, inspect_model


# -- a tiny diffusers-style DiT with grouped-query attention and a text padding mask ----------------------------
class TinyGQAAttention(nn.Module):
    def __init__(self, dim, heads, kv_heads):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, dim // heads
        self.to_q = nn.Linear(dim, heads * self.head_dim)
        self.to_k = nn.Linear(dim, kv_heads * self.head_dim)
        self.to_v = nn.Linear(dim, kv_heads * self.head_dim)
        self.to_out = nn.ModuleList([nn.Linear(heads * self.head_dim, dim)])

    def forward(self, hidden_states, attention_mask=None):
        b, s, _ = hidden_states.shape
        q = self.to_q(hidden_states).view(b, s, self.heads, self.head_dim).transpose(1, 2)
        k = self.to_k(hidden_states).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.to_v(hidden_states).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=attention_mask, enable_gqa=True)
        return self.to_out[0](out.transpose(1, 2).reshape(b, s, -1))


class TinyJointBlock(nn.Module):
    def __init__(self, dim, heads, kv_heads):
        super().__init__()
        self.attn = TinyGQAAttention(dim, heads, kv_heads)
        self.ff = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))

    def forward(self, hidden_states, encoder_hidden_states, temb, attention_mask=None):
        n_txt = encoder_hidden_states.shape[1]
        joint = torch.cat([encoder_hidden_states, hidden_states], dim=1) + temb[:, None]
        joint = joint + self.attn(joint, attention_mask=attention_mask)
        joint = joint + self.ff(joint)
        return joint[:, n_txt:], joint[:, :n_txt]


class TinyXBlock(nn.Module):
    """A block whose first input is named `x` (and is passed by that name) and whose text input comes third."""

    def __init__(self, dim, heads, kv_heads):
        super().__init__()
        self.attn = TinyGQAAttention(dim, heads, kv_heads)

    def forward(self, x, temb, context):
        return x + self.attn(x + temb[:, None] + context.mean(1, keepdim=True))


class TinyGQATransformer(ModelMixin, ConfigMixin):
    @register_to_config
    def __init__(self, in_channels=4, dim=32, heads=4, kv_heads=2, num_layers=2, loop_bias=False, num_x_blocks=0):
        super().__init__()
        self.proj_in = nn.Linear(in_channels, dim)
        self.time_embed = nn.Linear(1, dim)
        self.transformer_blocks = nn.ModuleList([TinyJointBlock(dim, heads, kv_heads) for _ in range(num_layers)])
        self.x_blocks = nn.ModuleList([TinyXBlock(dim, heads, kv_heads) for _ in range(num_x_blocks)])
        self.proj_out = nn.Linear(dim, in_channels)

    def forward(self, hidden_states, encoder_hidden_states, timestep, encoder_attention_mask=None):
        hidden_states = self.proj_in(hidden_states)
        temb = self.time_embed(timestep[:, None].float() / 1000)
        image = torch.ones(hidden_states.shape[:2], dtype=torch.bool)
        mask = torch.cat([encoder_attention_mask, image], dim=1)[:, None, None, :]
        for i, block in enumerate(self.transformer_blocks):
            hidden_states, encoder_hidden_states = block(hidden_states, encoder_hidden_states, temb,
                                                         attention_mask=mask)
            if self.config.loop_bias:
                hidden_states = hidden_states + 0.01 * (i + 1)
        for block in self.x_blocks:
            hidden_states = block(x=hidden_states, temb=temb, context=encoder_hidden_states)
        return self.proj_out(hidden_states)


class TinyGQAPipeline(DiffusionPipeline):
    def __init__(self, transformer, scheduler):
        super().__init__()
        self.register_modules(transformer=transformer, scheduler=scheduler)

    @torch.no_grad()
    def __call__(self, prompt="", height=32, width=32, num_inference_steps=2, output_type="latent", generator=None):
        dim, channels = self.transformer.config.dim, self.transformer.config.in_channels
        text = torch.randn(1, 8, dim, generator=generator)
        mask = torch.ones(1, 8, dtype=torch.bool)
        mask[:, 6:] = False  # two padding tokens
        latents = torch.randn(1, (height // 8) * (width // 8), channels, generator=generator)
        self.scheduler.set_timesteps(num_inference_steps)
        for t in self.scheduler.timesteps:
            noise = self.transformer(latents, text, t.expand(1), encoder_attention_mask=mask)
            latents = self.scheduler.step(noise, t, latents).prev_sample
        return latents


def tiny_gqa_anatomy(**config):
    torch.manual_seed(0)
    pipe = TinyGQAPipeline(TinyGQATransformer(**config).eval(), FlowMatchEulerDiscreteScheduler())
    call, dropped = build_call(pipe, request.build({}, height=64, width=64))
    assert dropped == [] and "negative_prompt" not in call  # nothing the user did not ask for
    return analyse(pipe, call, model="tiny-gqa")


# -- fixtures ---------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def flux():
    return inspect_model("zoo:flux")


@pytest.fixture(scope="module")
def wan():
    return inspect_model("zoo:wan")


def _list(anatomy, attribute, transformer="transformer"):
    return next(b for b in anatomy.block_lists if b.attribute == attribute and b.transformer == transformer)


# -- zoo models -------------------------------------------------------------------------------------------------
def test_flux_block_lists_and_cache_dit_adapter(flux):
    assert flux.pipeline.cls == "FluxPipeline"
    assert [c.cls for c in flux.components["transformers"]] == ["FluxTransformer2DModel"]
    assert [c.cls for c in flux.components["text_encoders"]] == ["CLIPTextModel", "T5EncoderModel"]
    assert flux.components["transformers"][0].source_file.endswith("transformer_flux.py")
    double, single = _list(flux, "transformer_blocks"), _list(flux, "single_transformer_blocks")
    assert (double.length, double.block_class) == (2, "FluxTransformerBlock")
    assert (single.length, single.block_class) == (4, "FluxSingleTransformerBlock")
    for block in (double, single):
        assert block.outputs == ["encoder_hidden_states", "hidden_states"]
        assert block.pattern == "Pattern_1" and block.role_evidence == "flow"
        assert block.check_forward_pattern and not block.patch_functor_needed and not block.loop_findings
        assert [p.name for p in block.signature][:2] == ["hidden_states", "encoder_hidden_states"]
    adapter = flux.cache_dit["adapter"]
    # cache-dit 1.5.3 merges both lists into one (dummy single blocks) with Pattern_1 and a PatchFunctor.
    assert adapter["prefix"] == "Flux"
    assert adapter["block_lists"] == [["transformer_blocks + single_transformer_blocks"]]
    assert adapter["forward_patterns"] == [["Pattern_1"]]
    assert adapter["dummy_blocks_names"] == ["single_transformer_blocks"]
    assert adapter["patch_functor"] == "FluxPatchFunctor" and adapter["has_separate_cfg"] is False
    assert flux.cache_dit["cp_planners"] == {"transformer": "FluxContextParallelismPlanner"}
    assert flux.cache_dit["tp_planners"] == {"transformer": "FluxTensorParallelismPlanner"}
    assert flux.cache_dit["text_encoder_planners"] == {"text_encoder": None,
                                                       "text_encoder_2": "T5EncoderTensorParallelismPlanner"}
    assert flux.cache_dit["vae_planners"] == {"vae": "AutoencoderKLDataParallelismPlanner"}
    assert "flux" in flux.cache_dit["cli_examples"]
    assert not torch.distributed.is_initialized()


def test_flux_calls_attention_and_sequence(flux):
    assert flux.calls_per_step == 1 and flux.calls_by_step == [1] * 8 and flux.has_separate_cfg is False
    assert (flux.attention.heads, flux.attention.kv_heads, flux.attention.head_dim) == (4, 4, 16)
    assert not flux.attention.gqa and not flux.attention.mask and not flux.attention.fused_qkv
    s = flux.sequence
    assert (s.image_tokens, s.text_tokens, s.attention_tokens, s.joint) == (1024, 32, 1056, True)
    assert {g.kind for g in flux.attention.groups} == {"joint"}
    assert s.divisibility["4"]["ulysses"] == "ok" and s.divisibility["8"]["ulysses"] == "ulysses-anything"
    assert s.gather_candidates[-1] == "proj_out"
    assert any(t.startswith("pos_embed:") for t in s.per_token_tables)
    assert flux.warnings == []


def test_wan_pattern_2_and_cross_attention(wan):
    blocks = _list(wan, "blocks")
    assert (blocks.length, blocks.block_class, blocks.outputs) == (4, "WanTransformerBlock", ["hidden_states"])
    assert blocks.pattern == "Pattern_2" and not blocks.patch_functor_needed
    assert wan.cache_dit["adapter"]["forward_patterns"] == [["Pattern_2"]]
    assert wan.calls_per_step == 2 and wan.has_separate_cfg is True
    kinds = {g.group: g.kind for g in wan.attention.groups}
    assert kinds == {"blocks.*.attn1": "self", "blocks.*.attn2": "cross"}
    assert (wan.sequence.image_tokens, wan.sequence.text_tokens, wan.sequence.joint) == (48, 16, False)
    assert [t.split(":")[0] for t in wan.sequence.per_token_tables] == ["rope"]
    assert wan.attention.qk_norm_across_heads  # Wan normalises q/k over all heads


def test_qwen_image_two_calls_per_step():
    anatomy = inspect_model("zoo:qwen-image")
    assert anatomy.calls_per_step == 2 and anatomy.has_separate_cfg is True
    assert anatomy.transformer_calls == {"transformer": 16}  # the zoo call: 8 steps, 2 calls each
    assert _list(anatomy, "transformer_blocks").pattern == "Pattern_1"
    assert anatomy.cache_dit["adapter"]["has_separate_cfg"] is True
    assert anatomy.cache_dit["text_encoder_planners"] == {"text_encoder": "Qwen2_5_VLTensorParallelismPlanner"}


def test_second_transformer_like_wan_2_2(zoo_path):
    from diffusers import WanPipeline

    base = ditgate.load(zoo_path("wan"))
    pipe = WanPipeline(tokenizer=base.tokenizer, text_encoder=base.text_encoder, vae=base.vae,
                       scheduler=base.scheduler, transformer=base.transformer,
                       transformer_2=copy.deepcopy(base.transformer), boundary_ratio=0.5)
    call, _ = build_call(pipe, request.build({"call": zoo.get("wan").call}, steps=4))
    anatomy = analyse(pipe, call, model="zoo:wan", steps=4)
    assert [c.name for c in anatomy.components["transformers"]] == ["transformer", "transformer_2"]
    assert [(b.transformer, b.pattern) for b in anatomy.block_lists] == [("transformer", "Pattern_2"),
                                                                         ("transformer_2", "Pattern_2")]
    assert anatomy.calls_by_step == [2, 2, 2, 2] and sum(anatomy.transformer_calls.values()) == 8
    assert anatomy.transformer_calls["transformer_2"] > 0
    assert anatomy.cache_dit["adapter"]["transformers"] == ["transformer", "transformer_2"]


def test_thirty_heads_do_not_divide_by_four(zoo_path):
    from diffusers import FluxTransformer2DModel

    pipe = ditgate.load(zoo_path("flux"))
    torch.manual_seed(0)
    pipe.register_modules(transformer=FluxTransformer2DModel(
        patch_size=1, in_channels=16, num_layers=1, num_single_layers=1, attention_head_dim=16,
        num_attention_heads=30, joint_attention_dim=32, pooled_projection_dim=32, guidance_embeds=False,
        axes_dims_rope=[4, 4, 8]).eval())
    call, _ = build_call(pipe, request.build({"call": zoo.get("flux").call}))
    anatomy = analyse(pipe, call, model="zoo:flux")
    assert anatomy.attention.heads == 30
    table = anatomy.sequence.divisibility
    assert table["2"]["heads"] and table["2"]["tp"] and table["2"]["ulysses"] == "ok"
    assert table["4"]["heads"] is False and table["4"]["tp"] is False
    assert table["4"]["ulysses"] == "ulysses-anything" and table["4"]["image_tokens"] is True
    assert "tp=4: not divisible" in anatomy.plan


# -- a model cache-dit does not know ----------------------------------------------------------------------------
def test_gqa_and_mask_are_reported():
    anatomy = tiny_gqa_anatomy()
    at = anatomy.attention
    assert (at.heads, at.kv_heads, at.head_dim, at.gqa) == (4, 2, 8, True)
    assert at.mask is True and at.mask_all_true is False
    assert any(s.startswith("kernel transformer.transformer_blocks.*.attn") for s in at.mask_sources)
    assert "transformer input transformer(encoder_attention_mask)" in at.mask_sources
    assert anatomy.attention.groups[0].enable_gqa
    blocks = _list(anatomy, "transformer_blocks")
    assert blocks.outputs == ["hidden_states", "encoder_hidden_states"] and blocks.pattern == "Pattern_0"
    assert not blocks.patch_functor_needed
    assert anatomy.sequence.divisibility["4"]["kv_heads"] is False  # 2 KV heads
    assert anatomy.sequence.divisibility["4"]["tp"] is False
    assert anatomy.cache_dit["adapter"] is None and anatomy.cache_dit["cp_planners"] == {"transformer": None}
    assert "--integration integration.py" in anatomy.plan and "GQA" in anatomy.plan


def test_work_between_blocks_and_renamed_inputs_need_a_patch_functor():
    anatomy = tiny_gqa_anatomy(loop_bias=True, num_x_blocks=2)
    joint = _list(anatomy, "transformer_blocks")
    assert joint.patch_functor_needed
    assert any("hidden_states changes between block 0 and block 1" in f for f in joint.loop_findings)
    assert joint.stream_changed_between and not joint.per_block_arguments  # the scaffold marks it NOT HANDLED
    x = _list(anatomy, "x_blocks")
    assert x.outputs == ["hidden_states"] and x.pattern == "Pattern_3" and not x.loop_findings
    assert x.check_forward_pattern is False and "'x'" in x.pattern_reason
    # The loop passes `x=` by keyword: cached blocks expect `hidden_states`, so the call cannot be forwarded.
    assert x.patch_functor_needed and "cannot take the loop's call" in x.pattern_reason


def test_bare_transformer_pattern_against_cache_dit_adapter():
    """Bria's blocks return (encoder_hidden_states, hidden_states) in diffusers 0.42.1: Pattern_1, observed; the
    adapter registered in cache-dit 1.5.3 declares Pattern_0 for both lists."""
    from diffusers import BriaTransformer2DModel

    from ditgate.inspect.anatomy import observe_transformer
    from ditgate.inspect.plan.support import describe_adapter

    torch.manual_seed(0)
    model = BriaTransformer2DModel(patch_size=1, in_channels=16, num_layers=2, num_single_layers=2,
                                   attention_head_dim=16, num_attention_heads=2, joint_attention_dim=32,
                                   axes_dims_rope=[4, 6, 6]).eval()
    inputs = dict(hidden_states=torch.randn(1, 64, 16), encoder_hidden_states=torch.randn(1, 8, 32),
                  timestep=torch.tensor([500.0]), img_ids=torch.zeros(64, 3), txt_ids=torch.zeros(8, 3))
    lists, between, calls = observe_transformer(model, lambda: model(**inputs))
    assert calls == 1
    assert [(b.attribute, b.pattern) for b in lists] == [("transformer_blocks", "Pattern_1"),
                                                         ("single_transformer_blocks", "Pattern_1")]
    assert all(b.outputs == ["encoder_hidden_states", "hidden_states"] for b in lists)
    adapter, error = describe_adapter(model)
    assert error is None and adapter.prefix == "Bria"
    assert adapter.forward_patterns == [["Pattern_0", "Pattern_0"]]


# -- the command ------------------------------------------------------------------------------------------------
def test_cli_human(run_cli):
    code, out, err = run_cli("inspect", "zoo:flux")
    assert code == 0, err
    for section in ("Components", "Block lists", "Attention", "Sequence", "cache-dit 1.5.3 provides"):
        assert section in out.splitlines()
    assert "transformer.single_transformer_blocks" in out and "Pattern_1" in out
    assert "has_separate_cfg = False" in out and "ulysses-anything" in out


def test_cli_json_matches_the_api_and_writes_the_plan(run_cli, tmp_path, wan):
    plan = tmp_path / "plans" / "wan.md"
    code, out, err = run_cli("inspect", "zoo:wan", "--json", "--plan", plan)
    assert code == 0, err
    data = json.loads(out)
    assert data == json.loads(json.dumps(wan.to_dict(), default=str))
    assert plan.read_text() == data["plan"]
    assert [p.name for p in plan.parent.iterdir()] == ["wan.md"]  # no temporary file left behind
    headings = [line for line in data["plan"].splitlines() if line.startswith("## ")]
    assert [h.split(" ", 2)[1] for h in headings if h[3].isdigit()] == ["1.", "2.", "3.", "4.", "5.", "6.", "7."]
    assert "Check: `ditgate run zoo:wan --rows baseline,cache --prompt " in data["plan"]


def test_cli_errors(run_cli, tmp_path):
    code, _, err = run_cli("inspect", str(tmp_path / "missing"))
    assert code == 2 and "does not exist" in err
    with pytest.raises(SystemExit):
        run_cli("inspect", "zoo:flux", "--steps", "0")
