# Tidelog: one image for brokers and the command-line tools.
#
#   docker build -t tidelog .                  the broker image (the default target)
#   docker build --target spark -t tidelog-spark .   + Java and PySpark, for deploy/spark jobs
#   docker run -v $PWD/broker.toml:/etc/tidelog/broker.toml:ro -v tidelog-data:/var/lib/tidelog \
#              -e TIDELOG_ZOOKEEPER_CONNECT=zk:2181 -p 9092:9092 tidelog
#
# The entrypoint is `tidelog broker`; its config is /etc/tidelog/broker.toml (by default
# deploy/config/single-node.toml; mount your own) and TIDELOG_* variables override it
# (deploy/config/broker.env.example lists every one). SIGTERM is a controlled shutdown:
# give the container time to finish it (docker stop -t 120, compose stop_grace_period).
# The install steps are the ones `./dev setup` runs (tests/component/ops checks that they
# stay the same): the pinned requirements, then the project without dependencies. The
# broker image installs only what a broker needs (requirements-lock.txt: no PySpark,
# pyarrow, pandas or test tools); the spark stage adds requirements-spark-lock.txt.

FROM python:3.11-slim AS tidelog

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /opt/tidelog

# Dependencies first: this layer is rebuilt only when the lock file changes.
COPY requirements-lock.txt ./
RUN pip install --no-cache-dir -r requirements-lock.txt

COPY pyproject.toml README.md LICENSE ./
COPY protocol/ protocol/
COPY broker/ broker/
COPY client/ client/
COPY spark_connector/ spark_connector/
COPY webconsole/ webconsole/
RUN pip install --no-cache-dir --no-deps .

COPY deploy/config/ /etc/tidelog/examples/
COPY deploy/config/single-node.toml /etc/tidelog/broker.toml

# /etc/tidelog/pki: where compose's security-init service writes the CA, the broker
# certificates and keys (a named volume takes this directory's owner and mode when created).
RUN groupadd --system --gid 10001 tidelog \
 && useradd --system --uid 10001 --gid tidelog --home-dir /var/lib/tidelog --shell /usr/sbin/nologin tidelog \
 && mkdir -p /var/lib/tidelog/logs /etc/tidelog/pki \
 && chown -R tidelog:tidelog /var/lib/tidelog /etc/tidelog/pki \
 && chmod 700 /etc/tidelog/pki

USER 10001:10001
WORKDIR /var/lib/tidelog
VOLUME ["/var/lib/tidelog"]
# 9092: the broker's listener (compose: 9092-9094 for clients on the host, 19092 inside its
# network); 9404: metrics.port
EXPOSE 9092 9404

# Ready = loaded its logs, registered in ZooKeeper, received the cluster metadata (broker/health.py).
# The check reads the same config and TIDELOG_* environment as the broker, so it probes the
# broker's own listener whatever port the config gives it.
HEALTHCHECK --interval=10s --timeout=10s --start-period=60s --retries=3 \
    CMD ["tidelog", "health", "--config", "/etc/tidelog/broker.toml", "--quiet"]

STOPSIGNAL SIGTERM
ENTRYPOINT ["tidelog", "broker"]
CMD ["--config", "/etc/tidelog/broker.toml"]


# The example Spark pipeline (deploy/spark/, docker-compose profile "spark"): Java for Spark
# and the Spark connector's pinned dependencies (the project's "spark" extra).
FROM tidelog AS spark
USER 0:0
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends openjdk-17-jre-headless \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /opt/tidelog
COPY requirements-spark-lock.txt ./
RUN pip install --no-cache-dir -r requirements-spark-lock.txt
USER 10001:10001
WORKDIR /var/lib/tidelog
HEALTHCHECK NONE
ENTRYPOINT ["python"]
CMD ["-c", "import pyspark; print('pyspark', pyspark.__version__)"]


# The default target: the broker image.
FROM tidelog AS broker
