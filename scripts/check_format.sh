#!/usr/bin/env bash
# The C and C++ sources against .clang-format (clang-format 14, as Debian 12 ships it), then no
# function under src/ over 120 lines (scripts/long_functions.py): the source checks CI runs, in one.
#   scripts/check_format.sh          lists the files that are not formatted and the long functions;
#                                    exits 1 if any
#   scripts/check_format.sh --fix    rewrites the unformatted files in place
# Files: the tracked .c/.cc/.cpp/.cu/.cuh/.h/.hpp under the folders below. CLANG_FORMAT names
# another binary; other major versions format some constructs differently, hence the warning.
set -euo pipefail
cd "$(dirname "$0")/.."

CLANG_FORMAT=${CLANG_FORMAT:-clang-format}
FOLDERS=(src include mpi_tests tests perf fuzz python)

mode=check
case "${1:-}" in
  "") ;;
  --fix) mode=fix ;;
  *) echo "usage: $0 [--fix]" >&2; exit 2 ;;
esac

if ! command -v "$CLANG_FORMAT" >/dev/null; then
  echo "check_format: $CLANG_FORMAT not found (apt-get install clang-format)" >&2
  exit 2
fi
version=$("$CLANG_FORMAT" --version | sed -n 's/.*version \([0-9]*\)\..*/\1/p')
[[ "$version" == 14 ]] || echo "check_format: $CLANG_FORMAT is version ${version:-unknown}, the style is checked with 14" >&2

mapfile -t files < <(git ls-files -- "${FOLDERS[@]}" | grep -E '\.(c|cc|cpp|cu|cuh|h|hpp)$')

if [[ $mode == fix ]]; then
  printf '%s\0' "${files[@]}" | xargs -0 -n 50 "$CLANG_FORMAT" -i --style=file
  echo "check_format: formatted ${#files[@]} files"
  exit 0
fi

# --dry-run prints "FILE:LINE:COL: warning: code should be clang-formatted" per difference.
mapfile -t bad < <(printf '%s\0' "${files[@]}" | xargs -0 -n 50 "$CLANG_FORMAT" --dry-run --style=file 2>&1 |
                   sed -n 's/^\([^:]*\):[0-9]*:[0-9]*: warning: code should be clang-formatted.*/\1/p' | sort -u)
if ((${#bad[@]})); then
  printf '%s\n' "${bad[@]}"
  echo "check_format: ${#bad[@]} of ${#files[@]} files are not formatted (scripts/check_format.sh --fix)" >&2
  exit 1
fi
echo "check_format: ${#files[@]} files formatted"
# The benchmarks' mains and the bindings' option lists (outside src/) are longer and not checked.
mapfile -t sources < <(git ls-files 'src/*.cpp' 'src/*.c' 'src/*.cu')
python3 scripts/long_functions.py --max 120 "${sources[@]}"
