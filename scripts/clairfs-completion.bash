# bash completion for clairfs: subcommands, flags, directories, and -o's option names (asked of
# `clairfs --help`, so they are the binary's own), comma-separated.
_clairfs_options() {
  clairfs --help 2>/dev/null | sed -n -E 's/^  ([a-z_]+)(\[?=[^ ]*)?( .*|$)/\1\2/p' | sed -E 's/\[=.*//; s/=.*/=/'
}

_clairfs() {
  local cur prev words cword
  _init_completion -n = 2>/dev/null || {
    cur=${COMP_WORDS[COMP_CWORD]}
    prev=${COMP_WORDS[COMP_CWORD-1]}
    cword=$COMP_CWORD
  }
  if [[ $prev == -o ]]; then
    local done=${cur%,*} last=${cur##*,} opts
    [[ $done == "$cur" ]] && done="" || done="$done,"
    opts=$(_clairfs_options)
    local IFS=$'\n'
    COMPREPLY=($(compgen -P "$done" -W "$opts" -- "$last"))
    [[ ${#COMPREPLY[@]} -eq 1 && ${COMPREPLY[0]} == *= ]] && compopt -o nospace 2>/dev/null
    return
  fi
  if ((cword == 1)); then
    COMPREPLY=($(compgen -W "index status cleanup --help --version" -- "$cur") $(compgen -d -- "$cur"))
    return
  fi
  case ${COMP_WORDS[1]} in
    status) COMPREPLY=($(compgen -W "--watch" -- "$cur") $(compgen -d -- "$cur")) ;;
    cleanup) COMPREPLY=($(compgen -W "--stop -o" -- "$cur") $(compgen -d -- "$cur")) ;;
    index) COMPREPLY=($(compgen -W "-o" -- "$cur") $(compgen -f -- "$cur")) ;;
    *) COMPREPLY=($(compgen -W "-f -d -o" -- "$cur") $(compgen -d -- "$cur")) ;;
  esac
}
complete -F _clairfs clairfs
