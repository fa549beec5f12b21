#!/usr/bin/env bash
# Installs TaskBridge from this checkout (and OpenCode, if it is missing), registers it with your
# MCP clients, then starts it.
#   ./install.sh                      ask each question
#   ./install.sh --yes                yes to everything: install OpenCode if missing, register
#                                     Claude Code (if installed), Claude Desktop and OpenCode's reverse bridge,
#                                     start the server
#   --claude-code / --claude-desktop  register that client without asking
#   --opencode                        register the reverse bridge (OpenCode asks Claude) in
#                                     OpenCode's opencode.json without asking
#   --tunnel cloudflare|ngrok         show how to start public-URL mode with that tunnel
#   --no-start                        install only        --dev   a debug build (faster to build)
# At the end it runs `taskbridge doctor`, then starts the control center in the directory you ran
# it from (not in this checkout: tasks run in the repository the TUI starts in).
set -euo pipefail
user_dir="$PWD"
cd "$(dirname "${BASH_SOURCE[0]}")"
checkout="$PWD"

yes=0 start=1 dev=0 code=ask desktop=ask opencode=ask tunnel=""
while [ $# -gt 0 ]; do
  case "$1" in
    -y|--yes) yes=1 ;;
    --no-start) start=0 ;;
    --dev) dev=1 ;;
    --claude-code) code=yes ;;
    --claude-desktop) desktop=yes ;;
    --opencode) opencode=yes ;;
    --tunnel) shift; tunnel="${1:-}" ;;
    -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
    *) echo "install.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done
case "$tunnel" in ""|cloudflare|ngrok) ;; *) echo "install.sh: --tunnel takes cloudflare or ngrok" >&2; exit 2 ;; esac

said_no_tty=0
ask() {
  [ "$yes" = 1 ] && return 0
  if ! [ -t 0 ]; then
    if [ "$said_no_tty" = 0 ]; then
      echo "install.sh: standard input is not a terminal, so every question is answered no; run ./install.sh --yes to answer yes to all." >&2
      said_no_tty=1
    fi
    echo "  (no) $1" >&2
    return 1
  fi
  read -r -p "$1 [Y/n] " reply
  [ -z "$reply" ] || [ "${reply,,}" = y ] || [ "${reply,,}" = yes ]
}

command -v cargo >/dev/null || { echo "install.sh: cargo is needed: https://rustup.rs" >&2; exit 1; }
if [ "$dev" = 1 ]; then
  cargo install --path . --locked --debug
else
  cargo install --path . --locked
fi
bin_dir="${CARGO_INSTALL_ROOT:-${CARGO_HOME:-$HOME/.cargo}}/bin"
bin="$bin_dir/taskbridge"
[ -x "$bin" ] || bin="$(command -v taskbridge)"

if ! command -v opencode >/dev/null && [ -z "${TASKBRIDGE_OPENCODE:-}" ]; then
  if ask "OpenCode is not installed. Install it now (npm install -g opencode-ai@1.18.33)?"; then
    # A global install goes to npm's prefix, which for a user other than root is usually a
    # system directory; then it goes under ~/.local instead, and the script says so.
    prefix=()
    npm_root="$(npm prefix -g 2>/dev/null || true)"
    if [ "$(id -u)" != 0 ] && { [ -z "$npm_root" ] || ! [ -w "$npm_root" ]; }; then
      prefix=(--prefix "$HOME/.local")
      echo "npm's global prefix (${npm_root:-unknown}) is not yours to write: installing OpenCode under ~/.local instead (npm install -g --prefix ~/.local); make sure ~/.local/bin is on your PATH."
    fi
    npm install -g "${prefix[@]}" --no-audit --no-fund opencode-ai@1.18.33
  else
    echo "TaskBridge needs OpenCode to run tasks: npm install -g opencode-ai@1.18.33 (or set TASKBRIDGE_OPENCODE)."
  fi
fi

# Registered only where Claude Code is installed, unless asked for by name (--claude-code).
if [ "$code" = ask ] && ! command -v claude >/dev/null; then
  code=no
  echo "Claude Code is not installed (no \`claude\` on PATH), so TaskBridge is not registered with it; after installing it, run: $bin config claude-code --write"
fi
if [ "$code" = yes ] || { [ "$code" = ask ] && ask "Register TaskBridge with Claude Code (user scope)?"; }; then
  "$bin" config claude-code --write
fi
# Claude Desktop exists for macOS and Windows only: on Linux it is not offered unless asked for.
if [ "$desktop" = ask ] && [ "$(uname -s)" = Linux ]; then
  desktop=no
  echo "Claude Desktop runs on macOS and Windows only, so it is not registered here (--claude-desktop registers it anyway)."
fi
if [ "$desktop" = yes ] || { [ "$desktop" = ask ] && ask "Register TaskBridge with Claude Desktop?"; }; then
  "$bin" config claude-desktop --write
fi
if [ "$opencode" = yes ] || { [ "$opencode" = ask ] && ask "Let OpenCode ask Claude (register the reverse bridge in opencode.json)?"; }; then
  "$bin" config opencode --write
  echo "The bridge is for your own OpenCode sessions; TaskBridge's tasks get it from workers started with --claude-bridge (or claude_bridge = true under [worker] in config.toml), which open the queue to the agent."
fi
if [ -z "$tunnel" ] && [ "$yes" = 0 ] && [ -t 0 ]; then
  read -r -p "Tunnel for public-URL mode (cloudflare, ngrok, or Enter for none): " tunnel
fi

cat <<MSG

TaskBridge is installed at $bin.
  Claude Code, by hand:   $("$bin" config claude-code | grep -m1 '^claude mcp add')
  Any HTTP client:        $bin serve   (then http://127.0.0.1:8765/mcp, with the bearer token the
                          server keeps in its home: \`$bin config claude-code\` shows where)
  The control center:     $bin tui
MSG
if [ -n "$tunnel" ]; then
  echo "  Public URL:             $bin serve --public $tunnel   (prints the URL and the line that registers it)"
fi

echo
echo "Checking the set-up (taskbridge doctor):"
"$bin" doctor || echo "(fix the lines marked FAIL above, then run \`taskbridge doctor\` again)"

if [ "$start" = 1 ]; then
  echo
  if [ "$user_dir" = "$checkout" ]; then
    # New tasks run in the repository the TUI starts in; TaskBridge's own source is not it.
    echo "To start the control center, cd to your project and run: taskbridge tui"
  elif ! [ -t 0 ] || ! [ -t 1 ]; then
    echo "Not a terminal, so the control center was not started; in your project run: taskbridge tui"
  else
    echo "Starting the control center in $user_dir (MCP on http://127.0.0.1:8765/mcp, a worker inside; q quits)."
    cd "$user_dir"
    exec "$bin" tui
  fi
fi
