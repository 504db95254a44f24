# acp-bridge as a container: on stdio (`docker run -i`) or as a sidecar (`serve`).
# Node is the base because the agent presets run through npx; Python comes from Debian.
FROM node:22-bookworm-slim

RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv ca-certificates tini \
    && rm -rf /var/lib/apt/lists/*

# Only for builds behind a TLS-intercepting proxy: the path of a CA bundle mounted into
# the build. Unset (the default), pip uses its own bundle.
ARG PIP_CERT
RUN python3 -m venv /opt/acp-bridge
# The dependencies get a layer of their own: a source change does not download them again.
COPY pyproject.toml /src/
RUN /opt/acp-bridge/bin/python -c "import tomllib; print('\n'.join(tomllib.load(open('/src/pyproject.toml', 'rb'))['project']['dependencies']))" > /tmp/requirements.txt \
    && /opt/acp-bridge/bin/pip install --no-cache-dir -r /tmp/requirements.txt \
    && rm /tmp/requirements.txt
COPY README.md /src/
COPY acp_bridge /src/acp_bridge
COPY adapters /src/adapters
COPY config /src/config
RUN /opt/acp-bridge/bin/pip install --no-cache-dir --no-deps /src && rm -rf /src

ENV PATH=/opt/acp-bridge/bin:$PATH \
    XDG_STATE_HOME=/home/node/.local/state \
    PYTHONUNBUFFERED=1
# The state directory exists, owned by the user, before it becomes a volume: a fresh named
# volume takes its owner from here (created by the engine it would belong to root).
RUN mkdir -p /home/node/.local/state && chown -R node:node /home/node/.local
USER node
WORKDIR /home/node
# The session database lives here; mount a volume to keep prompts across containers.
VOLUME /home/node/.local/state

# tini is PID 1: it forwards SIGTERM to the bridge, which stops every agent process it
# started, and it reaps orphaned grandchildren.
ENTRYPOINT ["tini", "--", "acp-bridge"]
CMD ["--agent", "claude"]
