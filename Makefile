# mlenv: thin front end over the `mlenv` CLI. `make help` lists the targets.
# Variables: CLUSTER (name or path), MODE (rdma|tcp), NODES, IMAGE, OUT, POD, CMD, FOLLOW, DELETE_DATA,
#            SCRIPT, ARGS, LAUNCHER, YES.

SHELL := /bin/bash
VENV  ?= .venv
MLENV := $(VENV)/bin/mlenv
# Values reach the CLI through the environment ("$$VAR"), never spliced into the shell command line, and
# verbatim: make does not expand a `$` inside them (make exec CMD='echo $HOSTNAME' echoes each pod's name).
USER_VARS := CLUSTER MODE NODES IMAGE OUT POD CMD SCRIPT ARGS LAUNCHER
$(foreach v,$(USER_VARS),$(if $(filter command line environment,$(origin $(v))),$(eval override $(v) := $$(value $(v)))))
export $(USER_VARS)
CLUSTER_ARG = $(if $(CLUSTER),"$$CLUSTER")
CLUSTER_OPT = $(if $(CLUSTER),--cluster "$$CLUSTER")
POD_OPT = $(if $(POD),--pod "$$POD")
OPTS = $(if $(MODE),--mode "$$MODE") $(if $(NODES),--nodes "$$NODES")
IMAGE_OPT = $(if $(IMAGE),--image "$$IMAGE")

.DEFAULT_GOAL := help
.PHONY: help install install-train install-system test lint bench demo list-clusters validate-cluster \
        render-cluster deploy-cluster-dry-run deploy-cluster status-cluster sync-multi-node shell-multi-node \
        exec logs clean-cluster launch nccl-test

help: ## List the targets
	@grep -hE '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  \033[1m%-24s\033[0m %s\n", $$1, $$2}'

install: ## Create .venv and install mlenv with dev tools (idempotent)
	@scripts/install.sh

install-train: ## install + torch (CPU) and deepspeed
	@scripts/install.sh train

install-system: ## install + rsync, iproute2 and kubectl when missing
	@scripts/install.sh system

test: ## Install everything the tests need, then run them
	@scripts/install.sh train system
	@scripts/test.sh

lint: install ## ruff (with bandit S rules) and mypy
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

bench: ## Benchmarks (ratios against a reference run in the same process)
	@scripts/install.sh train system
	$(VENV)/bin/python -m tests.bench

demo: ## Fresh machine -> local 2-node cluster -> sync -> train -> summary -> clean
	@scripts/install.sh train system
	$(MLENV) demo

list-clusters: install ## Clusters: backend, nodes x GPUs, RDMA, storage, description
	@$(MLENV) list

validate-cluster: install ## Validate CLUSTER=name|path [MODE=] [NODES=]
	@$(MLENV) validate $(CLUSTER_ARG) $(OPTS)

render-cluster: install ## Render CLUSTER= [MODE=] [NODES=] [IMAGE=] [OUT=dir] (stdout without OUT)
	@$(MLENV) render $(CLUSTER_ARG) $(OPTS) $(IMAGE_OPT) $(if $(OUT),-o "$$OUT")

deploy-cluster-dry-run: install ## Print the exact manifests deploy-cluster would apply
	@$(MLENV) deploy $(CLUSTER_ARG) $(OPTS) $(IMAGE_OPT) --dry-run

deploy-cluster: install ## Deploy CLUSTER= [MODE=] [NODES=] and wait until every pod is Ready
	@$(MLENV) deploy $(CLUSTER_ARG) $(OPTS) $(IMAGE_OPT)

status-cluster: install ## Pods, nodes, readiness, GPUs, IPs of the active deployment
	@$(MLENV) status $(CLUSTER_ARG)

sync-multi-node: install ## Sync workspace/ to /workspace on every pod
	@$(MLENV) sync $(CLUSTER_OPT)

shell-multi-node: install ## Interactive shell in pod 0 (or POD=N)
	@$(MLENV) shell $(CLUSTER_OPT) $(POD_OPT)

exec: install ## Run CMD="..." on every pod in parallel
	@$(MLENV) exec $(CLUSTER_OPT) -- sh -c "$$CMD"

logs: install ## Logs of every pod (or POD=N), FOLLOW=1 to follow
	@$(MLENV) logs $(CLUSTER_OPT) $(POD_OPT) $(if $(FOLLOW),--follow)

launch: install ## Run SCRIPT= [ARGS=] [LAUNCHER=deepspeed|torchrun] on every node
	@$(MLENV) launch $(CLUSTER_OPT) $(if $(LAUNCHER),--launcher "$$LAUNCHER") $(if $(ARGS),--args "$$ARGS") -- "$${SCRIPT:-train_multi_node.py}"

nccl-test: install ## All-reduce bandwidth across every node, with the transport verdict
	@$(MLENV) nccl-test $(CLUSTER_OPT)

clean-cluster: install ## Delete the deployment (keeps data unless DELETE_DATA=1; YES=1 skips the question)
	@$(MLENV) clean $(CLUSTER_OPT) $(if $(DELETE_DATA),--delete-data) $(if $(YES),--yes)
