"""Configuration: the shipped presets, user overrides, error messages and ${VAR} expansion."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

import pytest

from acp_bridge.settings import (
    PRESETS_PACKAGE,
    SHIPPED_FILES,
    AgentPreset,
    ConfigError,
    VerifySpec,
    default_config_path,
    expand,
    load_config,
    resolve_state,
)
from acp_bridge.state.store import SessionStore

# HOME is the user's own: verify keeps npx downloads in the user's npm cache.
VERIFY_VARS = {"ENDPOINT_URL": "http://127.0.0.1:4242", "VERIFY_HOME": "/v", "HOME": "/home/u"}
CLAUDE_VERIFY_ENV = {
    "ANTHROPIC_BASE_URL": "http://127.0.0.1:4242",
    "ANTHROPIC_API_KEY": "sk-ant-acp-bridge-verify",
    "HOME": "/v",
    "npm_config_cache": "/home/u/.npm",
    "IS_SANDBOX": "1",
    "DISABLE_TELEMETRY": "1",
    "DISABLE_ERROR_REPORTING": "1",
    "DISABLE_AUTOUPDATER": "1",
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
}


@pytest.fixture
def no_user_file(tmp_path: Path) -> dict[str, str]:
    """An environment whose default user configuration file does not exist."""
    return {"XDG_CONFIG_HOME": str(tmp_path / "empty-config-home"), "HOME": str(tmp_path)}


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def verify_of(preset: AgentPreset) -> VerifySpec:
    assert preset.verify is not None
    return preset.verify


# --- shipped configuration -------------------------------------------------------------


def test_shipped_defaults_load(no_user_file: dict[str, str]) -> None:
    config = load_config(environ=no_user_file)
    bridge = config.bridge
    assert bridge.adapter == "auto"
    assert bridge.adapter_paths == []
    assert bridge.state == "default"
    assert bridge.on_omitted == "keep"
    assert bridge.allow_override is True
    assert bridge.max_prompt_bytes == 256 * 1024
    assert bridge.line_limit == 64 * 1024 * 1024
    assert bridge.shutdown_grace == 2.0
    assert bridge.log_level == "warning"
    assert bridge.trace is None
    assert bridge.trace_prompts is False
    assert set(config.agents) == {
        "claude",
        "claude-legacy",
        "goose",
        "codex",
        "codex-legacy",
        "gemini",
        "qwen",
        "opencode",
        "copilot",
        "cline",
        "kilo",
    }
    assert len(config.sources) == 2


def test_claude_preset_runs_the_native_package(no_user_file: dict[str, str]) -> None:
    claude = load_config(environ=no_user_file).agent("claude")
    assert claude.resolved_command({}) == [
        "npx",
        "-y",
        "@agentclientprotocol/claude-agent-acp@0.101.0",
    ]
    # Native, but its CLI pins prompts: the claude adapter's `snapshot: false` keeps a
    # changed prompt applicable on reload.
    assert claude.adapter == "claude"
    assert claude.env == {}
    verify = verify_of(claude)
    assert verify.endpoint == "anthropic"
    assert verify.resolved_env(VERIFY_VARS) == CLAUDE_VERIFY_ENV
    assert verify.args == [] and verify.dirs == []


def test_claude_legacy_preset_uses_the_claude_adapter(no_user_file: dict[str, str]) -> None:
    legacy = load_config(environ=no_user_file).agent("claude-legacy")
    assert legacy.resolved_command({}) == ["npx", "-y", "@zed-industries/claude-agent-acp@0.23.1"]
    assert legacy.adapter == "claude"
    verify = verify_of(legacy)
    assert verify.endpoint == "anthropic"
    assert verify.resolved_env(VERIFY_VARS) == CLAUDE_VERIFY_ENV


def test_goose_preset_honours_goose_binary(no_user_file: dict[str, str]) -> None:
    goose = load_config(environ=no_user_file).agent("goose")
    assert goose.adapter == "goose"
    assert goose.resolved_command({}) == ["goose", "acp"]
    assert goose.resolved_command({"GOOSE_BINARY": "/opt/goose/bin/goose"}) == [
        "/opt/goose/bin/goose",
        "acp",
    ]
    verify = verify_of(goose)
    assert verify.endpoint == "openai-chat"
    assert verify.resolved_env(VERIFY_VARS) == {
        "GOOSE_PROVIDER": "openai",
        "GOOSE_MODEL": "fake-model",
        "OPENAI_HOST": "http://127.0.0.1:4242",
        "OPENAI_API_KEY": "sk-acp-bridge-verify",
        "GOOSE_DISABLE_KEYRING": "1",
        "GOOSE_TELEMETRY_ENABLED": "false",
        "GOOSE_DISABLE_SESSION_NAMING": "true",
        "GOOSE_MODE": "auto",
        "HOME": "/v",
        "XDG_CONFIG_HOME": "/v/.config",
        "XDG_DATA_HOME": "/v/.local/share",
        "XDG_STATE_HOME": "/v/.local/state",
        "XDG_CACHE_HOME": "/v/.cache",
    }


def test_codex_preset_runs_codex_acp_2_configured_through_its_environment(
    no_user_file: dict[str, str],
) -> None:
    codex = load_config(environ=no_user_file).agent("codex")
    assert codex.adapter == "codex"
    assert codex.resolved_command({}) == ["npx", "-y", "@agentclientprotocol/codex-acp@2.6.0"]
    verify = verify_of(codex)
    assert verify.endpoint == "openai-responses"
    assert verify.resolved_args(VERIFY_VARS) == []  # 2.x ignores its command line
    env = verify.resolved_env(VERIFY_VARS)
    config = json.loads(env.pop("CODEX_CONFIG"))
    assert env == {
        "CODEX_HOME": "/v/codex-home",
        "FAKE_OPENAI_API_KEY": "sk-acp-bridge-verify",
        "HOME": "/v",
        "npm_config_cache": "/home/u/.npm",
    }
    assert config["model_provider"] == "acp-bridge-verify"
    provider = config["model_providers"]["acp-bridge-verify"]
    assert provider["base_url"] == "http://127.0.0.1:4242/v1"
    assert provider["wire_api"] == "responses"
    assert provider["env_key"] == "FAKE_OPENAI_API_KEY"
    assert provider["supports_websockets"] is False
    assert verify.resolved_dirs(VERIFY_VARS) == [Path("/v/codex-home")]


def test_codex_legacy_preset_points_codex_at_the_responses_endpoint(
    no_user_file: dict[str, str],
) -> None:
    codex = load_config(environ=no_user_file).agent("codex-legacy")
    assert codex.adapter == "codex"
    assert codex.resolved_command({}) == ["npx", "-y", "@zed-industries/codex-acp@0.16.0"]
    verify = verify_of(codex)
    assert verify.endpoint == "openai-responses"
    assert verify.resolved_env(VERIFY_VARS) == {
        "CODEX_HOME": "/v/codex-home",
        "FAKE_OPENAI_API_KEY": "sk-acp-bridge-verify",
        "HOME": "/v",
        "npm_config_cache": "/home/u/.npm",
    }
    assert verify.resolved_dirs(VERIFY_VARS) == [Path("/v/codex-home")]
    assert verify.resolved_args(VERIFY_VARS) == [
        "-c",
        "model_provider=acp-bridge-verify",
        "-c",
        'model_providers.acp-bridge-verify={name="acp-bridge verify",'
        'base_url="http://127.0.0.1:4242/v1",wire_api="responses",'
        'env_key="FAKE_OPENAI_API_KEY",request_max_retries=0,stream_max_retries=0,'
        "supports_websockets=false}",
        "-c",
        "model=gpt-5.4",
        "-c",
        "approval_policy=never",
        "-c",
        "sandbox_mode=read-only",
    ]


def test_opencode_preset_names_the_endpoint_in_opencodes_inline_config(
    no_user_file: dict[str, str],
) -> None:
    opencode = load_config(environ=no_user_file).agent("opencode")
    assert opencode.adapter == "opencode"
    assert opencode.resolved_command({}) == ["npx", "-y", "opencode-ai@1.18.33", "acp"]
    verify = verify_of(opencode)
    assert verify.endpoint == "openai-chat"
    env = verify.resolved_env(VERIFY_VARS)
    config = json.loads(env["OPENCODE_CONFIG_CONTENT"])
    (provider,) = config["provider"].values()
    assert provider["options"]["baseURL"] == "http://127.0.0.1:4242/v1"
    assert provider["npm"] == "@ai-sdk/openai-compatible"
    assert config["model"] == config["small_model"]
    assert env["HOME"] == "/v" and env["XDG_DATA_HOME"] == "/v/.local/share"


def test_copilot_preset_uses_copilots_own_provider_mode(no_user_file: dict[str, str]) -> None:
    copilot = load_config(environ=no_user_file).agent("copilot")
    assert copilot.adapter == "copilot"
    assert copilot.resolved_command({}) == ["npx", "-y", "@github/copilot@1.0.102", "--acp"]
    verify = verify_of(copilot)
    assert verify.endpoint == "openai-chat"
    env = verify.resolved_env(VERIFY_VARS)
    assert env["COPILOT_PROVIDER_BASE_URL"] == "http://127.0.0.1:4242/v1"
    assert env["COPILOT_OFFLINE"] == "true"
    assert env["COPILOT_PKG_CACHE_HOME"] == "/home/u/.cache/copilot"
    assert env["HOME"] == "/v"


def test_cline_preset_keeps_cline_off_its_hub_and_writes_the_endpoint_into_its_data(
    no_user_file: dict[str, str],
) -> None:
    cline = load_config(environ=no_user_file).agent("cline")
    assert cline.adapter == "cline"
    assert cline.resolved_command({}) == ["npx", "-y", "cline@3.0.65", "--acp"]
    # Also for the primary process, which is started before the adapter is chosen.
    assert cline.resolved_env({}) == {"CLINE_SESSION_BACKEND_MODE": "local"}
    verify = verify_of(cline)
    assert verify.endpoint == "openai-chat"
    assert verify.resolved_env(VERIFY_VARS)["HOME"] == "/v"
    ((path, text),) = verify.resolved_files(VERIFY_VARS).items()
    assert path == Path("/v/.cline/data/settings/providers.json")
    (entry,) = json.loads(text)["providers"].values()
    assert entry["settings"]["baseUrl"] == "http://127.0.0.1:4242/v1"
    assert entry["updatedAt"]  # cline ignores an entry without it


def test_kilo_preset_runs_the_binary_it_is_pointed_at_with_an_inline_provider(
    no_user_file: dict[str, str],
) -> None:
    kilo = load_config(environ=no_user_file).agent("kilo")
    assert kilo.adapter == "kilo"
    assert kilo.resolved_command({}) == ["kilo", "acp"]
    assert kilo.resolved_command({"KILO_BINARY": "/k/kilo"}) == ["/k/kilo", "acp"]
    verify = verify_of(kilo)
    assert verify.endpoint == "openai-chat"
    env = verify.resolved_env(VERIFY_VARS)
    config = json.loads(env["KILO_CONFIG_CONTENT"])
    (provider,) = config["provider"].values()
    assert provider["options"]["baseURL"] == "http://127.0.0.1:4242/v1"
    # KILO_CONFIG stays free for the adapter's own layer.
    assert "KILO_CONFIG" not in env
    assert env["HOME"] == "/v" and env["XDG_DATA_HOME"] == "/v/.local/share"


def test_unknown_preset_error_lists_known_names(no_user_file: dict[str, str]) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(environ=no_user_file).agent("amp")
    assert "'amp'" in str(caught.value)
    assert (
        "claude, claude-legacy, cline, codex, codex-legacy, copilot, gemini, goose, kilo, "
        "opencode, qwen" in str(caught.value)
    )


# --- user files ------------------------------------------------------------------------


def test_user_file_overrides_key_by_key_and_adds_presets(
    tmp_path: Path, no_user_file: dict[str, str]
) -> None:
    user = write(
        tmp_path / "config.yaml",
        """
bridge:
  on_omitted: default
  log_level: DEBUG
agents:
  claude:
    args: ["-y", "@agentclientprotocol/claude-agent-acp@0.102.0"]
    env: {CLAUDE_CONFIG_DIR: ~/claude}
    verify:
      env: {IS_SANDBOX: 0}
  mine:
    command: my-agent
    args: [--acp, 3]
    description: my own agent
""",
    )
    config = load_config(user, environ=no_user_file)
    assert config.sources[-1] == str(user)
    assert config.bridge.on_omitted == "default"
    assert config.bridge.log_level == "debug"
    assert config.bridge.allow_override is True  # untouched shipped value
    claude = config.agent("claude")
    # lists replace, mappings merge
    assert claude.args == ["-y", "@agentclientprotocol/claude-agent-acp@0.102.0"]
    assert claude.command == "npx"
    assert claude.env == {"CLAUDE_CONFIG_DIR": "~/claude"}
    claude_env = verify_of(claude).resolved_env(VERIFY_VARS)
    assert claude_env == {**CLAUDE_VERIFY_ENV, "IS_SANDBOX": "0"}
    # the shipped presets share one verify block; overriding one leaves the other alone
    assert verify_of(config.agent("claude-legacy")).resolved_env(VERIFY_VARS) == CLAUDE_VERIFY_ENV
    mine = config.agent("mine")
    assert mine.resolved_command({}) == ["my-agent", "--acp", "3"]
    assert mine.adapter == "auto"
    assert mine.verify is None


def test_default_user_file_is_found_under_xdg_config_home(tmp_path: Path) -> None:
    write(tmp_path / "xdg" / "acp-bridge" / "config.yaml", "bridge: {trace_prompts: true}\n")
    config = load_config(environ={"XDG_CONFIG_HOME": str(tmp_path / "xdg")})
    assert config.bridge.trace_prompts is True


def test_default_user_file_falls_back_to_dot_config(tmp_path: Path) -> None:
    environ = {"HOME": str(tmp_path)}
    assert default_config_path(environ) == tmp_path / ".config" / "acp-bridge" / "config.yaml"
    write(default_config_path(environ), "bridge: {shutdown_grace: 5}\n")
    assert load_config(environ=environ).bridge.shutdown_grace == 5.0


def test_explicit_file_replaces_the_default_user_file(tmp_path: Path) -> None:
    environ = {"XDG_CONFIG_HOME": str(tmp_path / "xdg")}
    write(tmp_path / "xdg" / "acp-bridge" / "config.yaml", "bridge: {log_level: error}\n")
    explicit = write(tmp_path / "other.yaml", "bridge: {trace: /tmp/trace.jsonl}\n")
    config = load_config(explicit, environ=environ)
    assert config.bridge.log_level == "warning"
    assert config.bridge.trace == "/tmp/trace.jsonl"


def test_empty_user_file_changes_nothing(tmp_path: Path, no_user_file: dict[str, str]) -> None:
    user = write(tmp_path / "config.yaml", "# nothing yet\n")
    with_empty = load_config(user, environ=no_user_file)
    assert with_empty.model_dump() == load_config(environ=no_user_file).model_dump()
    assert with_empty.sources[-1] == str(user)


# --- errors ----------------------------------------------------------------------------


def test_unknown_key_names_the_file_and_key_path(
    tmp_path: Path, no_user_file: dict[str, str]
) -> None:
    user = write(tmp_path / "config.yaml", "agents:\n  claude:\n    argz: [x]\n")
    with pytest.raises(ConfigError) as caught:
        load_config(user, environ=no_user_file)
    assert str(caught.value) == f"{user}: agents.claude.argz: unknown key (did you mean args?)"


def test_every_problem_gets_its_own_line(tmp_path: Path, no_user_file: dict[str, str]) -> None:
    user = write(
        tmp_path / "config.yaml",
        """
bridgee: {}
bridge:
  on_omitted: sometimes
  line_limit: 0
agents:
  new-agent:
    args: [x]
    verify: {endpoint: bedrock}
""",
    )
    with pytest.raises(ConfigError) as caught:
        load_config(user, environ=no_user_file)
    lines = str(caught.value).splitlines()
    assert len(lines) == 5, lines
    assert all(line.startswith(f"{user}: ") for line in lines)
    text = str(caught.value)
    assert f"{user}: bridgee: unknown key (did you mean bridge?)" in lines
    assert "bridge.on_omitted: Input should be 'keep' or 'default' (got 'sometimes')" in text
    assert "bridge.line_limit:" in text
    assert f"{user}: agents.new-agent.command: required key is missing" in lines
    assert "agents.new-agent.verify.endpoint:" in text
    assert caught.value.problems == lines


def test_list_items_are_named_by_index(tmp_path: Path, no_user_file: dict[str, str]) -> None:
    user = write(tmp_path / "c.yaml", "agents:\n  x:\n    command: x\n    args: [a, [b]]\n")
    with pytest.raises(ConfigError, match=r"c\.yaml: agents\.x\.args\[1\]: "):
        load_config(user, environ=no_user_file)


def test_missing_explicit_file_is_an_error(tmp_path: Path, no_user_file: dict[str, str]) -> None:
    missing = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError, match=f"{missing}: no such configuration file"):
        load_config(missing, environ=no_user_file)


def test_bad_yaml_names_the_file_and_line(tmp_path: Path, no_user_file: dict[str, str]) -> None:
    user = write(tmp_path / "config.yaml", "bridge:\n  adapter: [auto\n  trace: x\n")
    with pytest.raises(ConfigError) as caught:
        load_config(user, environ=no_user_file)
    message = str(caught.value)
    assert message.startswith(f"{user}: invalid YAML: line ")
    assert "\n" not in message


@pytest.mark.parametrize(("text", "kind"), [("- a\n- b\n", "list"), ("just words\n", "string")])
def test_non_mapping_top_level_is_an_error(
    tmp_path: Path, no_user_file: dict[str, str], text: str, kind: str
) -> None:
    user = write(tmp_path / "config.yaml", text)
    with pytest.raises(ConfigError, match=f"{user}: the top level must be a mapping.*{kind}"):
        load_config(user, environ=no_user_file)


def test_malformed_reference_is_caught_at_load_time(
    tmp_path: Path, no_user_file: dict[str, str]
) -> None:
    user = write(tmp_path / "config.yaml", "agents:\n  x:\n    command: ${1BAD}\n")
    with pytest.raises(ConfigError, match=f"{user}: agents.x.command: malformed variable"):
        load_config(user, environ=no_user_file)


# --- expansion -------------------------------------------------------------------------


def test_expand_replaces_defined_variables() -> None:
    assert expand("${A}/x/${B}", {"A": "1", "B": "2"}, "k") == "1/x/2"


def test_expand_uses_default_when_unset_or_empty() -> None:
    assert expand("${GOOSE_BINARY:-goose}", {}, "k") == "goose"
    assert expand("${GOOSE_BINARY:-goose}", {"GOOSE_BINARY": ""}, "k") == "goose"
    assert expand("${GOOSE_BINARY:-goose}", {"GOOSE_BINARY": "/g"}, "k") == "/g"
    assert expand("${EMPTY:-}", {}, "k") == ""


def test_expand_undefined_variable_names_the_key() -> None:
    with pytest.raises(ConfigError, match=r"^agents\.x\.env\.HOME: \$\{NOPE\} is not defined"):
        expand("${NOPE}/x", {}, "agents.x.env.HOME")


def test_expand_leaves_plain_dollars_and_unescapes_double_dollar() -> None:
    assert expand("$HOME costs $5", {"HOME": "/h"}, "k") == "$HOME costs $5"
    assert expand("$${HOME}", {"HOME": "/h"}, "k") == "${HOME}"


def test_expand_does_not_expand_what_it_substituted() -> None:
    assert expand("${A}", {"A": "${B}", "B": "no"}, "k") == "${B}"


def test_expansion_happens_at_use_time_and_names_the_preset_key(
    tmp_path: Path, no_user_file: dict[str, str]
) -> None:
    user = write(
        tmp_path / "config.yaml",
        "agents:\n  mine:\n    command: ${AGENT_BIN}\n    env: {TOKEN: '${MY_TOKEN}'}\n",
    )
    mine = load_config(user, environ=no_user_file).agent("mine")
    assert mine.resolved_command({"AGENT_BIN": "/bin/agent"}) == ["/bin/agent"]
    with pytest.raises(ConfigError, match=r"agents\.mine\.env\.TOKEN: \$\{MY_TOKEN\}"):
        mine.resolved_env({})
    with pytest.raises(ConfigError, match=r"agents\.mine\.command: \$\{AGENT_BIN\}"):
        mine.resolved_command({})


def test_codex_verify_args_need_the_endpoint(no_user_file: dict[str, str]) -> None:
    verify = verify_of(load_config(environ=no_user_file).agent("codex-legacy"))
    with pytest.raises(
        ConfigError, match=r"agents\.codex-legacy\.verify\.args\[3\]: \$\{ENDPOINT_URL\}"
    ):
        verify.resolved_args({"VERIFY_HOME": "/v"})


def test_state_setting_resolves_to_a_location(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    assert resolve_state("default", {}) == SessionStore.default_path()
    assert resolve_state(":memory:", {}) == ":memory:"
    assert resolve_state("${D}/s.db", {"D": "/data"}) == Path("/data/s.db")


def test_shipped_files_read_the_same_with_libyaml_and_pure_python() -> None:
    # The shipped files are parsed with libyaml for start-up time; the result must be what
    # the pure-Python loader (which a user's file goes through) reads.
    yaml = pytest.importorskip("yaml")
    if not hasattr(yaml, "CSafeLoader"):
        pytest.skip("PyYAML without libyaml")
    for name in SHIPPED_FILES:
        text = (resources.files(PRESETS_PACKAGE) / name).read_text(encoding="utf-8")
        assert yaml.load(text, Loader=yaml.CSafeLoader) == yaml.safe_load(text), name
