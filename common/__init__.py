"""Small shared pieces every app may use: the application error family. No models here."""
