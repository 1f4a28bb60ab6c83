# The platform's image: the app and its Python dependencies on Workbench's own Debian base, with no
# registry. Build it with scripts/build-platform-images.sh, which first makes the base (mmdebstrap, then
# `docker import`) and the wheelhouse .cache/platform-wheels (pip, in a container of the base on this
# machine's network, downloads the wheels from PyPI through this machine's index and certificates);
# `docker build` alone works once both exist.
# One image for every role: web (the default command), worker, beat and the offline model differ by command.
ARG BASE=workbench-base:latest

FROM ${BASE} AS dependencies
COPY .cache/platform-wheels/ /wheels/
RUN python3 -m venv /opt/venv \
    && /opt/venv/bin/pip install --quiet --no-index --no-cache-dir --disable-pip-version-check \
        --find-links /wheels --requirement /wheels/requirements.txt
# Which wheelhouse this stage installed: the script removes the stages of the wheelhouses it replaced.
ARG WHEELS=unknown
LABEL workbench.stage=platform-dependencies workbench.wheels=${WHEELS}

# A stage of its own, so that the wheels stay out of the image.
FROM ${BASE}
COPY --from=dependencies /opt/venv /opt/venv
RUN useradd --system --uid 10001 --user-group --home-dir /app --no-create-home --shell /usr/sbin/nologin workbench
ENV PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PYTHONPATH=/app \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    DJANGO_SETTINGS_MODULE=workbench.settings
WORKDIR /app
# What the processes run; .dockerignore lets in only these (and the wheels), so no .env, .vault or .venv.
COPY manage.py pyproject.toml /app/
COPY kernel /app/kernel
COPY sessions /app/sessions
COPY sandboxes /app/sandboxes
COPY vault /app/vault
COPY harness /app/harness
COPY workbench /app/workbench
COPY offline_model /app/offline_model
COPY templates /app/templates
COPY static /app/static
RUN python -m compileall -q /app
USER workbench
EXPOSE 8000
LABEL workbench.image=platform
CMD ["daphne", "--bind", "0.0.0.0", "--port", "8000", "workbench.asgi:application"]
