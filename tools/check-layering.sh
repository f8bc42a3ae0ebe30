#!/usr/bin/env bash
# Layering rules of DESIGN §2: the engine and kernels know nothing of nginx,
# the kernels nothing of the engine; the module is nginx-styled (no //
# comments, 80 columns).
set -euo pipefail
cd "$(dirname "$0")/.."
fail=0
if grep -rn 'ngx_' engine kernels --include='*.[ch]' --include='*.cu' \
        | grep -v '^engine/contract/hp_ipc' ; then
    echo "layering: nginx symbols in engine/ or kernels/" >&2; fail=1
fi
if grep -rn '#include "engine/' kernels; then
    echo "layering: kernels include engine headers" >&2; fail=1
fi
# engine/ is one folder per box, stacked (DESIGN §2, README "Layout"): a
# box includes only boxes on its own floor or below, never one above.
floors=(contract backend tokenizer model forward cache cluster serve cli)
for i in "${!floors[@]}"; do
    for above in "${floors[@]:$((i + 1))}"; do
        if grep -rn "#include \"engine/$above/" "engine/${floors[$i]}"; then
            echo "layering: engine/${floors[$i]} includes engine/$above" >&2
            fail=1
        fi
    done
done
# The backend seam (engine/backend/backend.h): only engine/backend/ names
# a kernel family; the rest of the engine runs ops through a backend.
if grep -rn '#include "kernels/\(cpu\|cuda\)/' engine \
        | grep -v '^engine/backend/\|^engine/test/'; then
    echo "layering: kernels/cpu or kernels/cuda included outside" \
         "engine/backend/" >&2; fail=1
fi
if grep -rn '//' ngx_hypic_module/*.[ch] | grep -v 'http://\|https://'; then
    echo "style: // comment in ngx_hypic_module/" >&2; fail=1
fi
if awk 'length > 80 { print FILENAME ":" FNR; bad = 1 } END { exit !bad }' \
        ngx_hypic_module/*.[ch]; then
    echo "style: line over 80 columns in ngx_hypic_module/" >&2; fail=1
fi
exit $fail
