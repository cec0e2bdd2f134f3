"""What comes from outside the zoo: Hugging Face GPT-2, Llama-family, Phi-3 and Gemma folders, PEFT adapters, and
the export back to them."""
