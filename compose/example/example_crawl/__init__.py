"""An example Scrapy project crawling the synthetic web through streams-sched."""
