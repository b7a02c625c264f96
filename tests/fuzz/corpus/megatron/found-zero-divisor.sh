A=x
A=$A$A
A=$A$A
--num-layers 0 --pipeline-model-parallel-size 0 --num-layers-per-virtual-pipeline-stage 3
