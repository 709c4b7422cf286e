# koord-recommender images, one per role, each with only what that role imports (the extras in pyproject.toml):
#   ROLE=serve  serve, sync and cluster-files (the chart's images.serve)      -> koord-recommender:0.1.0-serve
#   ROLE=train  training from Prometheus or files (the chart's images.train)  -> koord-recommender:0.1.0-train
#   ROLE=dask   train plus Dask, for the scheduler, the workers and --dask-scheduler runs
#   ROLE=all    everything, `recommender demo` included (its data is in every image)
# Build: docker build --build-arg ROLE=serve -t ghcr.io/koord-recommender/koord-recommender:0.1.0-serve .
# Installed sizes per role: docs/kubernetes.md ("Images").
#
# The base is python:3.11-slim-bookworm pinned by its multi-arch index digest, so a rebuild gets the same base;
# refresh it deliberately: docker buildx imagetools inspect python:3.11-slim-bookworm
ARG BASE=python:3.11-slim-bookworm@sha256:2e32f7d302adc1c37428355c1e646897c0c53f4fd60b6a551245fb90ee129f91

FROM ${BASE} AS build
ARG ROLE=serve
WORKDIR /src
COPY pyproject.toml constraints.txt README.md ./
COPY recommender recommender
COPY models models
COPY pipelines pipelines
COPY serving serving
COPY presentation presentation
COPY cli cli
RUN pip install --no-cache-dir --prefix=/install -c constraints.txt ".[${ROLE}]"

FROM ${BASE}
ARG ROLE=serve
COPY --from=build /install /usr/local
# The bundled Google 2019 trace (CC-BY 4.0, attribution in SOURCE.md), where `recommender demo` looks in an install.
COPY data/google-2019 /usr/local/share/koord-recommender/google-2019
RUN useradd --uid 10001 --user-group --create-home --home-dir /home/recommender recommender
USER 10001:10001
WORKDIR /home/recommender
LABEL org.opencontainers.image.title="koord-recommender (${ROLE})" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PYTHONDONTWRITEBYTECODE=1 MPLCONFIGDIR=/tmp/matplotlib KOORD_RECOMMENDER_SERVE__HOST=0.0.0.0
ENTRYPOINT ["recommender"]
CMD ["serve"]
