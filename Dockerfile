# One image for every role (migrate, web, worker, beat); docker-compose.yml picks the command.
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md alembic.ini ./
COPY src ./src
COPY migrations ./migrations
COPY examples ./examples
RUN pip install --no-cache-dir ".[postgres,redis]"
ENV PYTHONUNBUFFERED=1
USER nobody
