"""The tiny model folder: MLX-LM loads it as a checkpoint, split in files, with a chat template."""

from __future__ import annotations

import json

import pytest

from needs import require_module

require_module("mlx_lm", "MLX-LM (pip install -e '.[test]')")

from mlx_jupyter.models.tiny import write_tiny_model  # noqa: E402

pytestmark = pytest.mark.timeout(60)


def test_mlx_lm_loads_the_folder_and_generates_the_same_tokens_for_the_same_seed(tmp_path):
    import mlx_lm

    folder = write_tiny_model(tmp_path / "tiny", seed=3)
    again = write_tiny_model(tmp_path / "again", seed=3)
    replies = []
    for path in (folder, again):
        model, tokenizer = mlx_lm.load(str(path))
        prompt = tokenizer.apply_chat_template([{"role": "user", "content": "Hello!"}], add_generation_prompt=True)
        replies.append(mlx_lm.generate(model, tokenizer, prompt, max_tokens=12))
    assert replies[0] == replies[1] and len(replies[0]) > 0
    assert len(model.model.layers) == 4 and model.args.hidden_size == 64


def test_weights_are_split_in_two_files_that_the_index_lists(tmp_path):
    from safetensors import safe_open

    folder = write_tiny_model(tmp_path / "tiny", layers=4, files=2)
    index = json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"]
    files = sorted(set(index.values()))
    assert files == ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    held = {}
    for name in files:
        with safe_open(str(folder / name), "numpy") as f:
            held.update({key: name for key in f.keys()})
    assert held == index
    # pipeline loading reads only the files holding a rank's layers: layers 0-1 in one, 2-3 in the other
    assert index["model.layers.0.mlp.up_proj.weight"] != index["model.layers.3.mlp.up_proj.weight"]


def test_the_chat_template_frames_each_message_and_opens_the_reply(tmp_path):
    from mlx_lm.tokenizer_utils import load as load_tokenizer

    folder = write_tiny_model(tmp_path / "tiny")
    tokenizer = load_tokenizer(folder)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert text == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n"
    assert tokenizer.eos_token_ids == {tokenizer.convert_tokens_to_ids("<|im_end|>")}
    assert tokenizer.decode(tokenizer.encode("Each rank holds a part.")) == "Each rank holds a part."


def test_a_head_count_that_does_not_divide_is_refused(tmp_path):
    with pytest.raises(ValueError, match="must divide"):
        write_tiny_model(tmp_path / "bad", hidden=64, heads=5)
