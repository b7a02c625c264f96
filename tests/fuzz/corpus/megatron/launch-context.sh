#!/bin/bash
#SBATCH --nodes=2
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source $six_ALL_CCFRWORK/start-prod
[ ! -f pretrain_gpt.py ] && echo "not in Megatron-LM"
CMD="pretrain_gpt.py --num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 32 --pp-partition-method 'type:transformer|embedding' --activations-checkpoint-method uniform"
srun bash -c "python -m torch.distributed.run --nproc_per_node 2 $CMD --load $HERE/ckpt"
sh -c 'exit 3'
