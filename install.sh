#!/usr/bin/env bash
# Installs TaskBridge from this checkout (and OpenCode, if it is missing), then starts it.
#   ./install.sh            ask before installing OpenCode, then start
#   ./install.sh --yes      answer yes to every question
#   ./install.sh --no-start install only
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"

yes=0 start=1
for arg in "$@"; do
  case "$arg" in
    -y|--yes) yes=1 ;;
    --no-start) start=0 ;;
    -h|--help) sed -n '2,5p' "$0"; exit 0 ;;
    *) echo "install.sh: unknown option '$arg' (see --help)" >&2; exit 2 ;;
  esac
done

ask() {
  [ "$yes" = 1 ] && return 0
  [ -t 0 ] || return 1
  read -r -p "$1 [Y/n] " reply
  [ -z "$reply" ] || [ "${reply,,}" = y ] || [ "${reply,,}" = yes ]
}

command -v cargo >/dev/null || { echo "install.sh: cargo is needed: https://rustup.rs" >&2; exit 1; }
cargo install --path . --locked
bin="$(command -v taskbridge || echo "$HOME/.cargo/bin/taskbridge")"

if ! command -v opencode >/dev/null && [ -z "${TASKBRIDGE_OPENCODE:-}" ]; then
  if ask "OpenCode is not installed. Install it now (npm install -g opencode-ai@1.18.33)?"; then
    npm install -g --no-audit --no-fund opencode-ai@1.18.33
  else
    echo "TaskBridge needs OpenCode to run tasks: npm install -g opencode-ai (or set TASKBRIDGE_OPENCODE)."
  fi
fi

cat <<MSG

TaskBridge is installed at $bin.
Register it with your MCP client:
  Claude Code:     claude mcp add taskbridge -- $bin mcp
  Claude Desktop:  add to claude_desktop_config.json:
                   {"mcpServers": {"taskbridge": {"command": "$bin", "args": ["mcp"]}}}
  Any HTTP client: $bin serve   (then http://127.0.0.1:8765/mcp)
MSG

if [ "$start" = 1 ]; then
  echo
  echo "Starting the MCP server and worker on http://127.0.0.1:8765/mcp (Ctrl-C stops it)."
  exec "$bin" serve
fi
