"""What comes from outside the zoo: Hugging Face GPT-2, Llama-family, Phi-3 and Gemma folders (read once as a
``Folder``) and PEFT adapters, converted to and from the zoo's nets (a whole module's export is ``zoo.gpt.export``)."""
