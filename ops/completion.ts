import type { Command, Option } from "commander";

/**
 * Shell completion scripts made from the program's own command tree (`ax completion bash|zsh`),
 * so they never drift from the commands. Completes subcommands, flags and the values of flags
 * with fixed choices (`--misfire once|skip|all`, `-o json|yaml|wide`).
 */
interface Node { path: string; subs: string[]; flags: string[]; choices: Record<string, string[]> }

function walk(cmd: Command, prefix: string[], out: Node[], inherited: Option[]): void {
  const opts = [...inherited, ...cmd.options];
  const flags = opts.flatMap((o) => [o.long, o.short].filter((x): x is string => !!x)).concat("--help");
  const choices: Record<string, string[]> = {};
  for (const o of opts) if (o.argChoices?.length) for (const f of [o.long, o.short]) if (f) choices[f] = [...o.argChoices];
  const subs = cmd.commands.map((c) => c.name()).filter((n) => n !== "help");
  out.push({ path: prefix.join(" "), subs, flags: [...new Set(flags)], choices });
  for (const c of cmd.commands) walk(c, [...prefix, c.name()], out, prefix.length === 0 ? cmd.options.slice() : inherited);
}

const q = (s: string) => `'${s.replace(/'/g, "'\\''")}'`;

export function completionScript(program: Command, shell: "bash" | "zsh"): string {
  const nodes: Node[] = [];
  walk(program, [], nodes, []);
  const name = program.name();
  const cases = nodes.map((n) => {
    const choiceCases = Object.entries(n.choices).map(([f, c]) => `          ${q(f)}) words_=${q(c.join(" "))}; return ;;`).join("\n");
    return `      ${q(n.path)})\n        case "$prev_" in\n${choiceCases}\n        esac\n        words_=${q([...n.subs, ...n.flags].join(" "))} ;;`;
  }).join("\n");
  // One function both shells use: the command path (words that are subcommands) decides the candidates.
  const core = `__${name}_candidates() {
  # $1..: the words before the cursor (after the program name)
  local path_="" prev_="" w
  local -a known_=(${nodes.map((n) => q(n.path)).join(" ")})
  for w in "$@"; do
    local try_="\${path_:+$path_ }$w" k found_=0
    for k in "\${known_[@]}"; do [ "$k" = "$try_" ] && found_=1 && break; done
    [ $found_ = 1 ] && path_="$try_"
    prev_="$w"
  done
  words_=""
  case "$path_" in
${cases}
  esac
}`;
  if (shell === "bash") {
    return `# bash completion for ${name}: source <(${name} completion bash)
${core}
__${name}_complete() {
  local words_
  __${name}_candidates "\${COMP_WORDS[@]:1:COMP_CWORD-1}"
  COMPREPLY=( $(compgen -W "$words_" -- "\${COMP_WORDS[COMP_CWORD]}") )
}
complete -o default -F __${name}_complete ${name}
`;
  }
  return `#compdef ${name}
# zsh completion for ${name}: source <(${name} completion zsh)  (or save as _${name} on $fpath)
${core}
__${name}_complete() {
  local words_
  __${name}_candidates "\${(@)words[2,CURRENT-1]}"
  compadd -- \${=words_}
}
compdef __${name}_complete ${name}
`;
}
