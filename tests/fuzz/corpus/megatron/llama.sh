TP=4; PP=2
torchrun --nproc_per_node=8 pretrain_gpt.py --num-layers 32 --hidden-size 4096 --num-attention-heads 32 \
  --group-query-attention --num-query-groups 8 --ffn-hidden-size 14336 --swiglu --normalization RMSNorm \
  --untie-embeddings-and-output-weights --seq-length 8192 --vocab-size 128256 \
  --tensor-model-parallel-size $TP --pipeline-model-parallel-size $PP --micro-batch-size 1 --global-batch-size 64 \
  --recompute-activations --ddp-bucket-size 40000000 --attention-backend flash
