#!/bin/bash
# The layout's rules over the project's own includes (DESIGN.md section 2): every folder includes
# only the rooms below it, core/ holds rooms only, and pipeline/ never reaches the text or the
# synthesiser. Prints each include that breaks a rule (file:line, the include, the rule) and
# exits 1 when there is one.
#   check_includes.sh SOURCE_DIR
set -u
cd "${1:?usage: check_includes.sh SOURCE_DIR}" || exit 2

# folder  the folders of ours it may include (besides itself), as path prefixes
rules=(
  "kernels/|"
  "io/|"
  "core/util/|io/"
  "core/checkpoint/|core/util/ io/ kernels/"
  "core/model/|core/checkpoint/ core/util/ io/ kernels/"
  "core/text/|core/util/ core/model/token_constraint.h"
  "core/synth/|core/checkpoint/ core/text/tokenizer/ core/util/ io/ kernels/"
  "pipeline/|core/model/ core/checkpoint/ core/util/ io/ kernels/"
  "apps/|pipeline/ core/ io/ kernels/"
)
ours='^(core|io|kernels|pipeline|apps)/'
bad=0

for f in core/*; do
  if [ -f "$f" ] && [ "$f" != core/CMakeLists.txt ]; then
    echo "$f: a file directly in core/ (core/ holds rooms only: util, checkpoint, model, text, synth)"
    bad=1
  fi
done

for rule in "${rules[@]}"; do
  folder=${rule%%|*}
  allowed="$folder ${rule#*|}"
  while IFS=: read -r file line text; do
    inc=$(sed -E 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"([^"]+)".*/\1/' <<<"$text")
    [[ $inc =~ $ours ]] || continue
    ok=0
    for prefix in $allowed; do
      [[ $inc == "$prefix"* ]] && ok=1 && break
    done
    if [ $ok = 0 ]; then
      echo "$file:$line: includes $inc, but $folder may include only: $allowed"
      bad=1
    fi
  done < <(grep -rnE '^[[:space:]]*#[[:space:]]*include[[:space:]]*"' "$folder" --include='*.h' --include='*.cc')
done

[ $bad = 0 ] && echo "layout: every include points down"
exit $bad
