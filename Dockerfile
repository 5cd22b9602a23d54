# imgfilter with the CUDA backend. The NVIDIA driver comes from the host (NVIDIA
# Container Toolkit, `docker run --gpus all`); the CUDA user space (NVVM, libdevice,
# runtime, nvJitLink) comes from pip wheels through the cu12 / cu13 extra, so a slim
# Python image is enough: no CUDA base image, no system toolkit.
#
#   docker build -t imgfilter .                            # CUDA 12 wheels: driver >= 525
#   docker build -t imgfilter --build-arg CUDA_MAJOR=13 .  # CUDA 13 wheels: driver >= 580
#   docker run --rm --gpus all -v "$PWD:/data" imgfilter blur /data/in.jpg --k 21 -o /data/out.jpg
#
# Without --gpus (or without a usable GPU) `--backend auto` falls back to the CPU.
# Filters never run as root: see the entrypoint below. Compiled kernels are cached
# under /var/cache/imgfilter; mount a volume there to keep them between runs
# (`-v imgfilter-cache:/var/cache/imgfilter`).

ARG PYTHON_VERSION=3.12

FROM python:${PYTHON_VERSION}-slim AS build
# 12 (default) reaches the most drivers (>= 525, 580+ included) and GPUs (Maxwell
# and newer); 13 needs driver >= 580 and a Turing or newer GPU.
ARG CUDA_MAJOR=12
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore
RUN case "${CUDA_MAJOR}" in \
        12|13) ;; \
        *) echo "CUDA_MAJOR must be 12 or 13, not '${CUDA_MAJOR}'" >&2; exit 1 ;; \
    esac \
    && python -m venv /opt/imgfilter
WORKDIR /src
COPY pyproject.toml README.md ./
COPY imgfilter ./imgfilter
COPY kernels ./kernels
RUN /opt/imgfilter/bin/pip install ".[cu${CUDA_MAJOR}]" \
    && cd / && /opt/imgfilter/bin/imgfilter --version

FROM python:${PYTHON_VERSION}-slim
ARG CUDA_MAJOR=12
LABEL org.opencontainers.image.title="imgfilter" \
      org.opencontainers.image.description="GPU image filtering that matches OpenCV (Numba CUDA, CPU fallback)" \
      org.opencontainers.image.licenses="MIT"
# The wheels bundle their own libraries (opencv-python-headless needs no libGL or
# glib); libgomp1 gives Numba's CPU backend its OpenMP threading layer (without it
# Numba falls back to its simpler workqueue layer).
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends libgomp1 \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --user-group --no-create-home \
        --home-dir /nonexistent --shell /usr/sbin/nologin imgfilter \
    && install -d -m 1777 /var/cache/imgfilter \
    && install -d -o 10001 -g 10001 /data
COPY --from=build /opt/imgfilter /opt/imgfilter
# Filters never run as root. Started as root (the default), the entrypoint switches
# to the owner of the working directory (/data: normally the bind-mounted host
# folder), so `-v "$PWD:/data"` writes its outputs there, owned by you; where that
# owner is root it switches to the unprivileged user imgfilter (uid 10001). Started
# with `--user UID:GID`, it runs imgfilter as that user straight away.
RUN printf '%s\n' \
        '#!/opt/imgfilter/bin/python' \
        'import os, sys' \
        'if os.getuid() == 0:' \
        '    st = os.stat(".")' \
        '    uid, gid = (st.st_uid, st.st_gid) if st.st_uid != 0 else (10001, 10001)' \
        '    os.setgroups([])' \
        '    os.setgid(gid)' \
        '    os.setuid(uid)' \
        '    os.environ["HOME"] = "/tmp"' \
        'os.execv("/opt/imgfilter/bin/imgfilter", ["imgfilter", *sys.argv[1:]])' \
        >/usr/local/bin/imgfilter-entrypoint \
    && chmod 755 /usr/local/bin/imgfilter-entrypoint
ENV PATH=/opt/imgfilter/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility \
    IMGFILTER_CUDA_MAJOR=${CUDA_MAJOR} \
    XDG_CACHE_HOME=/var/cache/imgfilter \
    IMGFILTER_CACHE_DIR=/var/cache/imgfilter/kernels \
    NUMBA_CACHE_DIR=/var/cache/imgfilter/numba
WORKDIR /data
ENTRYPOINT ["imgfilter-entrypoint"]
CMD ["--help"]
