torchrun --nproc_per_node=8 pretrain_gpt.py --num-layers 6 --hidden-size 256 --num-attention-heads 4 --seq-length 128 \
  --vocab-size 1000 --tokenizer-type NullTokenizer --mtp-num-layers 1 --pipeline-model-parallel-size 4 \
  --pipeline-model-parallel-layout "Et|(t|)*5,m|L" --micro-batch-size 1 --global-batch-size 8
