#!/bin/bash
GPUS_PER_NODE=8
NNODES=${SLURM_NNODES:-2}
WORLD=$(( GPUS_PER_NODE * NNODES ))
case ${MODEL:-8B} in
  8B|7B) L=32; H=4096 ;;
  *) L=2; H=64 ;;
esac
add() { local f=$1; ARGS+=("--$f" "$2"); }
add num-layers $L
add hidden-size $H
for x in a b; do ARGS+=(--$x); done
i=0; while [ $i -lt 2 ]; do i=$((i+1)); done
cat <<EOF > ds.json
{}
EOF
if [[ $WORLD -ge 16 && -n "${ARGS[*]}" ]]; then T=8; else T=1; fi
P=/a/b/c.model
torchrun --nnodes $NNODES pretrain_gpt.py "${ARGS[@]}" --tensor-model-parallel-size $T --num-attention-heads 32 --seq-length 2048 --micro-batch-size 1 --global-batch-size ${#P} 2>&1 | tee log
