
fuzz-1^
userV
T<|im_start|>user
<|vision_start|><|image_pad|><|vision_end|>hi<|im_end|> 中文 😀H