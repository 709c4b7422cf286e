# The koord-recommender image: one image for serve, sync and train (the command is the first argument).
# Build: docker build -t ghcr.io/koord-recommender/koord-recommender:0.1.0 .
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml constraints.txt README.md ./
COPY recommender recommender
COPY models models
COPY pipelines pipelines
COPY serving serving
RUN pip install --no-cache-dir --prefix=/install -c constraints.txt .

FROM python:3.11-slim
COPY --from=build /install /usr/local
RUN useradd --uid 10001 --user-group --no-create-home recommender
USER 10001:10001
ENV PYTHONDONTWRITEBYTECODE=1 MPLCONFIGDIR=/tmp/matplotlib
ENTRYPOINT ["recommender"]
CMD ["serve", "--host", "0.0.0.0"]
