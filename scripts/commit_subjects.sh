#!/usr/bin/env bash
# Commit messages read as a list of what changed in `git log --oneline`: a subject of at most
# MAX_SUBJECT characters, then a blank line. This is the one place that rule is written.
#
#   commit_subjects.sh --message FILE   one message (scripts/hooks/commit-msg, each commit)
#   commit_subjects.sh                  every commit after START up to HEAD (CI's lint phase)
#   commit_subjects.sh --since COMMIT SECONDS
#                                       every commit after COMMIT (committed at SECONDS)
#
# "After" is both: not COMMIT or one before it, and committed later than it (a branch made
# before the rule and merged since is not held to it). A clone that lacks COMMIT (a shallow
# one) checks the commits it holds committed later than SECONDS, and says so.
set -euo pipefail
# Bytes throughout; a subject's characters are counted by leaving out UTF-8's continuation
# bytes, whatever locale the machine has.
export LC_ALL=C
MAX_SUBJECT=72
# The rule holds for every commit after this one, committed at START_TIME (seconds since the
# epoch); the history before it was written without it.
START=35e7e025c2bfe19272a14589b72f7cb27d2af735
START_TIME=1796615008
me=${0##*/}

# Sets `why` to why the message $1 breaks the rule, or to nothing when it keeps it (a
# variable, not an output: no process per commit). Lines starting with '#' are comments, as
# in the editor git opens.
check() {
  local subject='' second='' n=0 line chars
  why=
  while IFS= read -r line; do
    [[ $line == '#'* ]] && continue
    n=$((n + 1))
    if ((n == 1)); then
      subject=$line
    else
      second=$line
      break
    fi
  done <<<"$1"
  chars=${subject//[$'\x80'-$'\xbf']/}
  if ((${#chars} > MAX_SUBJECT)); then
    why="the subject is ${#chars} characters; keep it to $MAX_SUBJECT, details in the body"
  elif [[ -n $second ]]; then
    why="leave the second line blank, between the subject and the body"
  fi
}

if [[ ${1-} == --message ]]; then
  check "$(<"$2")"
  [[ -z $why ]] || { echo "$me: $why" >&2; exit 1; }
  exit 0
fi

since=$START
since_time=$START_TIME
if [[ ${1-} == --since ]]; then
  since=$2
  since_time=$3
fi
git rev-parse -q --verify 'HEAD^{commit}' >/dev/null 2>&1 || {
  echo "$me: no commit to check here (not a git clone, or no commit yet)" >&2
  exit 1
}
missing=
if git cat-file -e "$since^{commit}" 2>/dev/null; then
  revs=("$since..HEAD")
  since_time=$(git show -s --format=%ct "$since")
else
  revs=(HEAD)
  missing=clone
  [[ $(git rev-parse --is-shallow-repository) == true ]] && missing="shallow clone"
fi

mapfile -d '' -t entries < <(git log -z --format='%h %ct%n%B' "${revs[@]}")
wait $! || { echo "$me: git log failed" >&2; exit 1; }
bad=0
checked=0
for entry in "${entries[@]}"; do
  head=${entry%%$'\n'*}
  hash=${head%% *}
  time=${head##* }
  ((time > since_time)) || continue
  checked=$((checked + 1))
  message=${entry#*$'\n'}
  check "$message"
  if [[ -n $why ]]; then
    echo "$me: $hash: $why: ${message%%$'\n'*}" >&2
    bad=1
  fi
done
if [[ -n $missing ]]; then
  echo "$me: ${since:0:7} is not in this $missing; checked the $checked commit(s) it holds" \
    "committed after it" >&2
fi
exit $bad
