# acp-bridge as a container: on stdio (`docker run -i`) or as a sidecar (`serve`).
# Node is the base because the agent presets run through npx; Python comes from Debian.
FROM node:22-bookworm-slim

RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv ca-certificates tini \
    && rm -rf /var/lib/apt/lists/*

RUN python3 -m venv /opt/acp-bridge
COPY pyproject.toml README.md /src/
COPY acp_bridge /src/acp_bridge
COPY adapters /src/adapters
COPY config /src/config
RUN /opt/acp-bridge/bin/pip install --no-cache-dir /src && rm -rf /src

ENV PATH=/opt/acp-bridge/bin:$PATH \
    XDG_STATE_HOME=/home/node/.local/state
USER node
WORKDIR /home/node
# The session database lives here; mount a volume to keep prompts across containers.
VOLUME /home/node/.local/state

# tini reaps orphaned grandchildren (the bridge is not PID 1) and forwards signals.
ENTRYPOINT ["tini", "--", "acp-bridge"]
CMD ["--agent", "claude"]
