# One image for every role (migrate, web, worker, beat); docker-compose.yml picks the command.
# Its install is the one CI's production smoke proves (.ci/smoke_production.py): the wheel,
# built from the sdist, with the [postgres,redis] extras only.

# The wheel, built as CI builds it: the sdist first, then the wheel from the sdist.
FROM python:3.11-slim AS wheel
RUN pip install --no-cache-dir build
WORKDIR /src
COPY . .
RUN python -m build --outdir /dist .

FROM python:3.11-slim
WORKDIR /app
# The dependencies first, read from pyproject.toml alone (base + postgres + redis extras): this
# layer is rebuilt only when pyproject.toml changes, not at every change of the source.
COPY pyproject.toml /tmp/pyproject.toml
RUN python -c "import tomllib; p = tomllib.load(open('/tmp/pyproject.toml', 'rb'))['project']; \
extra = p['optional-dependencies']; print('\n'.join(p['dependencies'] + extra['postgres'] + extra['redis']))" \
      > /tmp/requirements.txt \
 && pip install --no-cache-dir -r /tmp/requirements.txt \
 && rm /tmp/requirements.txt /tmp/pyproject.toml
# Then the package itself, exactly as a user installs it (its dependencies are already there).
COPY --from=wheel /dist/*.whl /tmp/dist/
RUN pip install --no-cache-dir "$(ls /tmp/dist/*.whl)[postgres,redis]" && rm -rf /tmp/dist
# The application the compose file runs (APP=examples.quickstart.app); celery_mcp_tasks comes
# from the wheel, not from a source tree.
COPY examples ./examples
ENV PYTHONUNBUFFERED=1
USER nobody
