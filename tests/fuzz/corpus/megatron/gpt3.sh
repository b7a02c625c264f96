#!/bin/bash
GPUS_PER_NODE=8
NNODES=${SLURM_NNODES:-2}
MODEL_ARGS=(--num-layers 96 --hidden-size 12288 --num-attention-heads 96 --seq-length 2048 --max-position-embeddings 2048)
export CUDA_DEVICE_MAX_CONNECTIONS=1
torchrun --nproc_per_node $GPUS_PER_NODE --nnodes $NNODES pretrain_gpt.py \
    ${MODEL_ARGS[@]} \
    --tensor-model-parallel-size 8 --pipeline-model-parallel-size 16 \
    --num-layers-per-virtual-pipeline-stage 3 \
    --micro-batch-size 1 --global-batch-size 1536 \
    --recompute-granularity full --recompute-method uniform \
    --sequence-parallel --use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather \
    --bf16 --fp8-format hybrid --fp8-param-gather --tp-comm-overlap \
    --attention-dropout 0.0 --hidden-dropout 0.0 --disable-bias-linear \
    --train-iters 1000 --lr 6e-5 --data-path my_text_document
