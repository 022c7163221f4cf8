
fuzz-1
user
Hello! What is 2+2?