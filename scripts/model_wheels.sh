#!/usr/bin/env bash
# `python -m bench.model` under the transformers CI pins (requirements/ci.txt) on the GPU image, whose transformers
# (5.17 on 2026-11-29) copies the KV cache 4x for grouped-query attention at every decode step (`repeat_kv`, 1.3 ms of
# an 8B step on an H200) where 5.24 does not (`pack_gqa`). Wheels (~22 MiB, git-ignored) to carry beside .whl:
#   here:   bash scripts/model_wheels.sh                  -> .whl_model
#   device: carry [".whl", ".whl_model", ...], then before `python3 -m bench.model`:
#           python3 -m pip install -q --no-index --no-deps --target ~/site_model .whl_model/*.whl
#           export PYTHONPATH=~/site_model:$PYTHONPATH    (after ~/site: these take precedence)
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qx "/.whl_model/" .git/info/exclude 2>/dev/null || echo "/.whl_model/" >> .git/info/exclude
pin() { grep -i "^$1==" requirements/ci.txt; }
rm -rf .whl_model && mkdir -p .whl_model
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl_model \
  "$(pin transformers)" "$(pin tokenizers)" "$(pin huggingface_hub)" "$(pin httpx2)" "$(pin hf-xet)" \
  "$(pin httpcore2)" "$(pin h11)" "$(pin anyio)" "$(pin idna)" "$(pin truststore)" "$(pin click)" "$(pin typer)" \
  "$(pin shellingham)" "$(pin rich)" "$(pin markdown-it-py)" "$(pin mdurl)" "$(pin Pygments)" "$(pin annotated-doc)" \
  "$(pin regex)"
du -sh .whl_model
