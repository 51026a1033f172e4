# bash completion for clairfs: subcommands, flags, directories, and -o's option names (asked of
# `clairfs --help`, so they are the binary's own), comma-separated, with the values of those that take a
# word from a list, a folder or a file. Works with and without the bash-completion package.

# The option names `clairfs --help` lists, "name=" for those that take a value.
_clairfs_options() {
  clairfs --help 2>/dev/null | sed -n -E 's/^  ([a-z_]+)(\[?=[^ ]*)?( .*|$)/\1\2/p' | sed -E 's/\[=.*//; s/=.*/=/'
}

# The words of the blank-separated list $1 that start with $2, one a line.
_clairfs_words() {
  local IFS=$' \t\n'
  compgen -W "$1" -- "$2"
}

# The values of option $1 that start with $2, one a line; a folder's end in '/'.
_clairfs_values() {
  local IFS=$' \t\n' words=""
  case $1 in
    progress) words="watch reads opens" ;;
    order) words="torch torch-random torch-global sequential list clairfs" ;;
    log_level) words="debug info warning error" ;;
    log) words="syslog stderr" ;;
    seed | world_size) words="auto" ;;
    learn_from) words="auto any" ;;
    torch_version) words="1 2" ;;
    drop_last | loader_drop_last | shared_generator | persistent_workers) words="on off" ;;
  esac
  [[ -n $words ]] && _clairfs_words "$words" "$2"
  case $1 in
    nvme) compgen -d -S / -- "$2" ;;
    log | manifest | order_file | samples | trace | metrics_file)
      compgen -d -S / -- "$2"
      compgen -f -- "$2" | while read -r f; do [[ -d $f ]] || printf '%s\n' "$f"; done
      ;;
  esac
}

_clairfs() {
  # The words up to the cursor split at blanks only: bash's COMP_WORDS are split at '=' and ':' too
  # (COMP_WORDBREAKS), which would cut "-o seed=1,wo" apart.
  local line=${COMP_LINE:0:COMP_POINT} cur prev cword
  local -a w
  read -r -a w <<<"$line"
  [[ -z $line || $line == *[[:space:]] ]] && w+=("")
  cword=$((${#w[@]} - 1))
  cur=${w[cword]}
  prev=${w[cword - 1]:-}
  local IFS=$'\n'
  local -a found=()
  if [[ $prev == -o ]]; then
    local done=${cur%,*} last=${cur##*,}
    [[ $done == "$cur" ]] && done="" || done="$done,"
    if [[ $last == *=* ]]; then
      found=($(_clairfs_values "${last%%=*}" "${last#*=}"))
      found=("${found[@]/#/$done${last%%=*}=}")
    else
      found=($(compgen -P "$done" -W "$(_clairfs_options)" -- "$last"))
    fi
    # Readline puts a reply in place of the text after the word's last break character ('=' or ':'):
    # the replies lose what comes before it.
    local i
    for ((i = ${#cur} - 1; i >= 0; i--)); do
      [[ $COMP_WORDBREAKS == *"${cur:i:1}"* ]] && break
    done
    COMPREPLY=("${found[@]#"${cur:0:i+1}"}")
    [[ ${#COMPREPLY[@]} -eq 1 && ${COMPREPLY[0]} == *[=/] ]] && compopt -o nospace 2>/dev/null
    return 0
  fi
  if ((cword == 1)); then
    COMPREPLY=($(_clairfs_words "index status cleanup --help --version" "$cur") $(compgen -d -- "$cur"))
    return 0
  fi
  case ${w[1]} in
    status) COMPREPLY=($(_clairfs_words "--watch" "$cur") $(compgen -d -- "$cur")) ;;
    cleanup) COMPREPLY=($(_clairfs_words "--stop -o" "$cur") $(compgen -d -- "$cur")) ;;
    index) COMPREPLY=($(_clairfs_words "-o" "$cur") $(compgen -f -- "$cur")) ;;
    *) COMPREPLY=($(_clairfs_words "-f -d -o" "$cur") $(compgen -d -- "$cur")) ;;
  esac
  return 0
}
complete -F _clairfs clairfs
