# syntax=docker/dockerfile:1
# interference-scheduler: slim Python, the project in a venv, runs as an unprivileged user.
# Build from the repository root: make images (docker build -f deploy/docker/scheduler.Dockerfile .)
FROM python:3.11.11-slim-bookworm AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY interference/ interference/
COPY scheduler/ scheduler/
RUN python -m venv /opt/interference \
 && /opt/interference/bin/pip install --no-cache-dir .

FROM python:3.11.11-slim-bookworm
COPY --from=build /opt/interference /opt/interference
ENV PATH=/opt/interference/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
USER 10001:10001
EXPOSE 10251
ENTRYPOINT ["interference-scheduler"]
